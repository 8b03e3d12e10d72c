"""llama-server's ``/infill``: fill-in-the-middle for code editors (llama.vim, llama.vscode).

The prompt is the repo-level FIM pattern llama-server builds (Qwen2.5-Coder's, arXiv
2409.12186)::

    [FIM_REP]myproject\\n [FIM_SEP]file\\n extra chunk ... [FIM_SEP]filename\\n
    [BOS] [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]

(the extra chunks before BOS and the prompt after the prefix, as llama-server's code does;
``--spm-infill``: suffix before prefix). The prefix keeps its last ``3/4 n_batch`` tokens,
the suffix its first ``n_batch/4`` (less the prompt), extra chunks (``input_extra``, each
``{"filename", "text"}``) fill the context left after ``n_batch + 2 n_predict``, newest last.
A model without FIM prefix, suffix and middle tokens answers 501 as llama-server does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import EndpointDisabledError, InvalidOptionError

__all__ = ["check_infill", "infill_tokens"]

#: The separator between extra chunks when the vocabulary has no FIM file separator.
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"

Tokenize = Callable[[str], list[int]]


def check_infill(fim: Mapping[str, int], request: Any) -> None:
    """Raise llama-server's errors: 501 without FIM tokens, 400 for a malformed body."""
    missing = "".join(f"{name} token is missing. " for role, name in
                      (("pre", "prefix"), ("suf", "suffix"), ("mid", "middle"))
                      if fim.get(role, -1) < 0)
    if missing:
        raise EndpointDisabledError(f"Infill is not supported by this model: {missing}")
    if not isinstance(request, Mapping):
        raise InvalidOptionError("request body must be a JSON object")
    if "prompt" in request and not isinstance(request["prompt"], str):
        raise InvalidOptionError('"prompt" must be a string', option="prompt")
    for field in ("input_prefix", "input_suffix"):
        if not isinstance(request.get(field), str):
            raise InvalidOptionError(f'"{field}" is required (a string)', option=field)
    extra = request.get("input_extra", [])
    ok = isinstance(extra, list) and all(
        isinstance(c, Mapping) and isinstance(c.get("text"), str)
        and isinstance(c.get("filename", ""), str) for c in extra)
    if not ok:
        raise InvalidOptionError('"input_extra" must be an array of {"filename": string, '
                                 '"text": string}', option="input_extra")


def infill_tokens(fim: Mapping[str, int], tokenize: Tokenize, request: Mapping[str, Any], *,
                  n_batch: int, n_predict: int, n_ctx: int, spm: bool = False,
                  bos: int | None = None) -> list[int]:
    """The prompt token ids of a checked ``/infill`` request (see the module docstring);
    ``bos`` is prepended when given (the model adds BOS)."""
    prefix = tokenize(request["input_prefix"])
    suffix = tokenize(request["input_suffix"])
    prompt = tokenize(request.get("prompt", ""))
    extra = _extra_tokens(fim, tokenize, request.get("input_extra", []))
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * max(n_predict, 0)), len(extra))
    head = [fim["pre"], *prefix[len(prefix) - n_prefix:], *prompt]
    tail = [fim["suf"], *suffix[:n_suffix]]
    first, second = (tail, head) if spm else (head, tail)
    bos_ids = [bos] if bos is not None else []  # llama-server puts the extra chunks before it
    return [*extra[len(extra) - n_extra:], *bos_ids, *first, *second, fim["mid"]]


def _extra_tokens(fim: Mapping[str, int], tokenize: Tokenize,
                  chunks: Sequence[Mapping[str, str]]) -> list[int]:
    out: list[int] = []
    if fim.get("rep", -1) >= 0:
        out += [fim["rep"], *tokenize("myproject\n")]
    sep = fim.get("sep", -1)
    for chunk in chunks:
        if sep >= 0:
            out += [sep, *tokenize(chunk.get("filename", "tmp") + "\n")]
        else:
            out += tokenize(CHUNK_SEPARATOR)
        out += tokenize(chunk["text"])
    if sep >= 0:
        out += [sep, *tokenize("filename\n")]
    return out
