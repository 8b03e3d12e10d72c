"""What Ollama's model endpoints say about the served models: ``/api/tags``, ``/api/show``,
``/api/ps``, ``/api/version``, and the answers to model management we do not do.

- ``digest`` is the model file's sha256 (:func:`llamapy.fingerprint.model_fingerprint`,
  computed once per file), ``size`` the file's size, ``modified_at`` its modification time;
  ``details`` come from the GGUF metadata (``family`` from ``general.architecture``,
  ``parameter_size`` from the parameter count, ``quantization_level`` from
  ``general.file_type``).
- ``/api/show``'s ``template`` is the chat template (Jinja, not Ollama's Go templates),
  ``parameters`` the served defaults of the Ollama options, ``model_info`` a subset of the
  GGUF metadata, ``capabilities`` ``completion``, ``embedding``, and ``tools`` / ``thinking``
  when the template handles them.
- ``/api/pull`` of a model that is served answers ``{"status": "success"}`` (it is there);
  any other pull, and ``push``, ``create``, ``copy`` and ``delete``, is a typed 400: models
  are chosen when the server starts (:func:`refuse_model_op`).
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import UnsupportedFeatureError
from ..fingerprint import model_fingerprint
from ..openai_api.target import ServedModel

#: The version of Ollama's API whose surface these routes follow (``/api/version``).
OLLAMA_API_VERSION = "0.12.0"
#: ``general.file_type`` -> Ollama's quantization name (llama.cpp's ``llama_ftype``).
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
              10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
              16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS",
              21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
              26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
              32: "BF16", 36: "TQ1_0", 37: "TQ2_0"}
#: GGUF metadata keys ``/api/show`` reports in ``model_info`` (besides ``<arch>.*``).
INFO_KEYS = ("general.architecture", "general.basename", "general.name", "general.size_label",
             "general.file_type", "general.quantization_version", "general.license")


def file_facts(path: str) -> dict[str, Any]:
    """``size``, ``digest`` (``sha256:...``) and ``modified_at`` of a model file (blocking:
    the first digest of a file reads all of it)."""
    try:
        stat = os.stat(path)
        digest = model_fingerprint(path)
    except OSError:
        return {"size": 0, "digest": "", "modified_at": rfc3339(0.0)}
    return {"size": stat.st_size, "digest": digest, "modified_at": rfc3339(stat.st_mtime)}


def rfc3339(seconds: float) -> str:
    """A POSIX time in RFC 3339 (UTC)."""
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def parameter_size(n_params: int) -> str:
    """Ollama's spelling of a parameter count (``135.5M``, ``7.2B``)."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n_params >= scale:
            return f"{n_params / scale:.1f}{unit}"
    return str(n_params)


def details(served: ServedModel) -> dict[str, Any]:
    """``details`` of a loaded model, from its GGUF metadata."""
    model = served.model
    family = model.meta("general.architecture") or ""
    file_type = model.meta("general.file_type") or ""
    quant = FILE_TYPES.get(int(file_type)) if file_type.isdigit() else None
    return {"parent_model": "", "format": "gguf", "family": family,
            "families": [family] if family else None,
            "parameter_size": parameter_size(model.n_params),
            "quantization_level": quant or model.description.rsplit(" ", 1)[-1]}


def model_entry(served: ServedModel) -> dict[str, Any]:
    """One model of ``/api/tags`` (blocking: see :func:`file_facts`)."""
    facts = file_facts(str(served.server.model_path))
    return {"name": served.name, "model": served.name, **facts, "details": details(served)}


def unloaded_entry(name: str, path: str) -> dict[str, Any]:
    """``/api/tags`` entry of a model that is not loaded (no metadata to read yet)."""
    return {"name": name, "model": name, **file_facts(path),
            "details": {"parent_model": "", "format": "gguf", "family": "",
                        "families": None, "parameter_size": "", "quantization_level": ""}}


def running_entry(served: ServedModel, expires_at: str) -> dict[str, Any]:
    """One model of ``/api/ps`` (``size_vram`` 0: llamapy does not report device memory)."""
    entry = model_entry(served)
    entry.pop("modified_at")
    return {**entry, "expires_at": expires_at, "size_vram": 0,
            "context_length": served.n_ctx_seq()}


def capabilities(served: ServedModel, embeddings: bool = True) -> list[str]:
    """What the model can be asked for, as ``/api/show`` lists it (``embeddings``: whether
    the server answers ``/api/embed``)."""
    templates = served.chat_templates()
    out = ["completion", "tools"]  # (a template without tools gets them in its system turn)
    if templates.supports_enable_thinking or "<think>" in templates.source:
        out.append("thinking")
    if embeddings:
        out.append("embedding")
    if served.server.modalities["vision"]:
        out.append("vision")
    return out


def parameters(served: ServedModel) -> str:
    """``parameters``: the served defaults Ollama clients read (``name value`` lines)."""
    return f"num_ctx {served.n_ctx_seq()}\nnum_predict {served.n_predict}"


def model_info(served: ServedModel) -> dict[str, Any]:
    """``model_info``: the general GGUF keys and the architecture's own."""
    metadata = served.model.metadata()
    arch = metadata.get("general.architecture", "")
    out: dict[str, Any] = {}
    for key, value in sorted(metadata.items()):
        if key in INFO_KEYS or (arch and key.startswith(arch + ".")):
            out[key] = int(value) if value.isdigit() else value
    out["general.parameter_count"] = served.model.n_params
    return out


def show(served: ServedModel, embeddings: bool = True) -> dict[str, Any]:
    """The ``/api/show`` object (blocking: see :func:`file_facts`)."""
    template = served.chat_templates().source
    modelfile = (f"# Modelfile of {served.name}, served by llamapy\n"
                 f"FROM {Path(served.server.model_path).name}\n")
    return {"modelfile": modelfile, "parameters": parameters(served), "template": template,
            "details": details(served), "model_info": model_info(served),
            "capabilities": capabilities(served, embeddings),
            "modified_at": file_facts(str(served.server.model_path))["modified_at"]}


def version() -> dict[str, Any]:
    """``/api/version``: the Ollama API version followed, and llamapy's own."""
    from .. import __version__

    return {"version": OLLAMA_API_VERSION, "llamapy": __version__}


def refuse_model_op(operation: str) -> UnsupportedFeatureError:
    """The typed refusal of a model management operation (``pull``, ``push``, ...)."""
    return UnsupportedFeatureError(
        operation, f"/api/{operation} is not supported: llamapy serves the models it was "
                   "started with (--model, or several with --models); Hub models are pulled "
                   "with python -m llamapy pull, or by /api/pull and by name in a request "
                   "with --models-dir and --pull-on-demand")
