"""llama-server's native API on a ``Server``, so existing llama-server clients work.

``/completion`` (``n_predict``, ``cache_prompt``, ``n_probs``, ``timings``, ``stop_type``, ...),
``/tokenize``, ``/detokenize``, ``/apply-template``, ``/props`` and ``/slots``: request and
response fields as llama-server's README documents them (``response_fields`` picks paths of a
whole ``/completion`` response, such as ``generation_settings/n_predict``). A few llama-server
request fields that only tune its own bookkeeping are accepted and ignored
(:data:`IGNORED_FIELDS`); any other unknown field is a 400.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import __version__
from .._pins import LLAMA_CPP_COMMIT
from ..engine import DoneEvent, ProgressEvent, TokenEvent
from ..errors import InvalidOptionError
from ..options import aliases_of
from ..options._spec import is_int
from ..options.samplers import sampler_names
from ..server import Completion, GenerationIntent, ModelInfo
from .chat_request import from_chat_body
from .completions import check_token_ids
from .logprobs import MIN_CANDIDATES, sampled_logprob
from .media_parts import MEDIA_MARKER, mark_media
from .params import ChatBody, engine_extras, parse_body
from .prompt import render_prompt
from .prompt_shapes import native_prompts
from .report import per_token_timings, progress_dict, timings_dict
from .target import ServedModel

#: llama-server request fields that only tune its own bookkeeping: accepted, ignored.
IGNORED_FIELDS = ("n_keep", "post_sampling_probs", "verbose",
                  "t_max_predict_ms", "n_indent", "n_cmpl", "backend_sampling")
#: ``/completion``'s token budget spellings (the tree's aliases of ``max_tokens``, then
#: ``max_tokens`` itself); the first one present wins.
BUDGET_FIELDS = (*aliases_of("max_tokens"), "max_tokens")
#: Fields of ``/completion`` handled here rather than passed to the engine.
OWN_FIELDS = ("prompt", "stream", "return_tokens", "model", "json_schema", "response_fields",
              *BUDGET_FIELDS)
#: Most ``response_fields`` paths, and the longest one (characters).
MAX_RESPONSE_FIELDS = 64
MAX_FIELD_PATH = 256
#: ``stop_type`` by engine finish reason.
STOP_TYPES = {"eog": "eos", "stop": "word", "max_tokens": "limit", "prefill": "limit"}


def _probabilities(model: ModelInfo, token_id: int, candidates: Any, n_probs: int,
                   probs: bool = False) -> dict[str, Any]:
    """One ``completion_probabilities`` entry: ``logprob`` / ``top_logprobs``, or with
    ``post_sampling_probs`` (``probs``) llama-server's ``prob`` / ``top_probs`` (the model's
    probabilities, before the sampler's filters)."""
    key = "prob" if probs else "logprob"

    def entry(token: int, logprob: float) -> dict[str, Any]:
        piece = model.token_to_piece(token, True)
        return {"id": token, "token": piece.decode("utf-8", "replace"),
                key: math.exp(logprob) if probs else logprob, "bytes": list(piece)}

    candidates = list(candidates or ())
    out = entry(token_id, sampled_logprob(token_id, candidates))
    out["top_probs" if probs else "top_logprobs"] = [
        entry(t, lp) for t, lp in candidates[:n_probs] if not probs or math.exp(lp) > 0]
    return out


#: One prompt of a ``/completion`` ready to run: ``(token ids, text, typed engine options)``.
NativePrompt = tuple[Sequence[int], str, GenerationIntent]


def prepare_native(served: ServedModel, request: Mapping[str, Any]
                   ) -> tuple[list[NativePrompt], dict[str, Any]]:
    """Each prompt of a ``/completion`` (llama-server's shapes, :mod:`.prompt_shapes`) with its
    engine call options, and the request."""
    if not isinstance(request, Mapping):
        raise InvalidOptionError("request body must be a JSON object")
    served.check_model(request.get("model"))
    if "prompt" not in request:
        raise InvalidOptionError("missing field 'prompt'", option="prompt")
    pairs = native_prompts(served, request["prompt"])
    _check_response_fields(request.get("response_fields", []))
    if not isinstance(request.get("backend_sampling", False), bool):
        raise InvalidOptionError("backend_sampling must be a boolean", option="backend_sampling")
    extras = {k: v for k, v in request.items() if k not in OWN_FIELDS + IGNORED_FIELDS}
    fields = engine_extras(extras)
    if request.get("json_schema") is not None:
        from ..grammar.json_schema import schema_to_gbnf

        fields["grammar"] = schema_to_gbnf(request["json_schema"])
    n_predict = next((request[k] for k in BUDGET_FIELDS if k in request), -1)
    if not isinstance(n_predict, int) or isinstance(n_predict, bool):
        raise InvalidOptionError("n_predict must be an integer", option="n_predict")
    if is_int(fields.get("n_probs")) and fields["n_probs"] > 0:  # (else a 400 later)
        fields["n_probs"] = max(fields["n_probs"], MIN_CANDIDATES)
    budget = None if n_predict < 0 else n_predict
    return [(ids, text, served.intent(fields, ignore_eos=request.get("ignore_eos"),
                                      max_tokens=budget, prompt_tokens=len(ids)))
            for ids, text in pairs], dict(request)


def _check_response_fields(paths: object) -> None:
    """``response_fields``: a list of ``/``-separated paths into the response."""
    if not (isinstance(paths, list) and len(paths) <= MAX_RESPONSE_FIELDS and all(
            isinstance(p, str) and 0 < len(p) <= MAX_FIELD_PATH for p in paths)):
        raise InvalidOptionError(f"response_fields must be a list of at most "
                                 f"{MAX_RESPONSE_FIELDS} paths ('a/b', at most "
                                 f"{MAX_FIELD_PATH} characters each)", option="response_fields")


def select_fields(response: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """llama-server's ``response_fields``: only the values at ``paths`` (``/`` descends into
    objects), keyed by the path; a path that leads nowhere is left out. No paths: all."""
    if not paths:
        return response
    out: dict[str, Any] = {}
    for path in paths:
        value: Any = response
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


def _settings(served: ServedModel, intent: GenerationIntent) -> dict[str, Any]:
    """llama-server's ``generation_settings``: every option the request ran with, with
    ``n_predict`` (the token budget), ``logit_bias`` as ``[{"bias", "token"}]`` with ``null``
    for a banned token (``-inf``, as it reports the EOG bans of ``ignore_eos``) and the
    sampler chain under llama-server's canonical names."""
    settings = intent.settings()
    bias = settings.pop("logit_bias")
    return {"n_predict": settings["max_tokens"], "model": served.name, **settings,
            "logit_bias": [{"bias": None if math.isinf(b) else b, "token": t}
                           for t, b in bias.items()],
            "samplers": list(sampler_names(settings["samplers"]))}


def native_response(served: ServedModel, ids: Sequence[int], text: str, intent: GenerationIntent,
                    request: Mapping[str, Any], completion: Completion, index: int = 0
                    ) -> dict[str, Any]:
    """The ``/completion`` response of a finished generation (prompt ``index``; the route
    reduces it to the request's ``response_fields``, :func:`select_fields`)."""
    model = served.model
    n_probs = int(request.get("n_probs") or 0)
    out: dict[str, Any] = {
        "index": index, "content": completion.text,
        "tokens": list(completion.token_ids) if request.get("return_tokens") else [],
        "id_slot": completion.timings.slot_id, "stop": True, "model": served.name,
        "tokens_predicted": completion.completion_tokens,
        "tokens_evaluated": completion.usage.prompt_tokens,
        "generation_settings": _settings(served, intent), "prompt": text,
        "has_new_line": "\n" in completion.text, "truncated": False,
        "stop_type": STOP_TYPES.get(completion.finish_reason, "none"),
        "stopping_word": completion.stop_word,
        "tokens_cached": completion.usage.prompt_tokens + completion.completion_tokens,
        "timings": timings_dict(completion.timings, model, ids),
    }
    if n_probs:
        post = bool(request.get("post_sampling_probs"))
        out["completion_probabilities"] = [
            _probabilities(model, t, c, n_probs, post)
            for t, c in zip(completion.token_ids, completion.logprobs, strict=False)]
    return out


def native_chunk(served: ServedModel, request: Mapping[str, Any], event: TokenEvent,
                 n_done: int, ids: Sequence[int]) -> dict[str, Any]:
    """One streamed ``/completion`` chunk (``timings`` so far with ``timings_per_token``)."""
    out: dict[str, Any] = {"index": 0, "content": event.text, "tokens": [event.token_id],
                           "stop": False, "id_slot": event.slot_id, "tokens_predicted": n_done,
                           "tokens_evaluated": len(ids)}
    out.update(per_token_timings(event, served.model, ids))
    n_probs = int(request.get("n_probs") or 0)
    if n_probs:
        out["completion_probabilities"] = [_probabilities(
            served.model, event.token_id, event.logprobs, n_probs,
            bool(request.get("post_sampling_probs")))]
    return out


def native_progress(served: ServedModel, event: ProgressEvent, ids: Sequence[int]
                    ) -> dict[str, Any]:
    """A ``prompt_progress`` chunk of a streamed ``/completion`` (``return_progress``)."""
    return {"index": 0, "content": "", "tokens": [], "stop": False,
            "id_slot": event.timings.slot_id, "tokens_predicted": 0, "tokens_evaluated": len(ids),
            "prompt_progress": progress_dict(event),
            **per_token_timings(event, served.model, ids)}


def native_final(served: ServedModel, ids: Sequence[int], text: str, intent: GenerationIntent,
                 event: DoneEvent) -> dict[str, Any]:
    """The last streamed ``/completion`` chunk (``stop: true`` with timings)."""
    return {
        "index": 0, "content": "", "tokens": [], "id_slot": event.timings.slot_id, "stop": True,
        "model": served.name, "tokens_predicted": event.completion_tokens,
        "tokens_evaluated": event.prompt_tokens, "generation_settings": _settings(served, intent),
        "prompt": text, "truncated": False,
        "stop_type": STOP_TYPES.get(str(event.finish_reason), "none"),
        "stopping_word": event.stop_word,
        "tokens_cached": event.prompt_tokens + event.completion_tokens,
        "timings": timings_dict(event.timings, served.model, ids),
    }


# --- small endpoints ------------------------------------------------------------------------


def tokenize(served: ServedModel, request: Mapping[str, Any]) -> dict[str, Any]:
    """``/tokenize``: ``content``, ``add_special`` (false), ``parse_special`` (true),
    ``with_pieces``."""
    _check_object(request)
    content = request.get("content")
    if not isinstance(content, str):
        raise InvalidOptionError("content must be a string", option="content")
    model = served.model
    ids = model.tokenize(content, bool(request.get("add_special", False)),
                         bool(request.get("parse_special", True)))
    if not request.get("with_pieces"):
        return {"tokens": ids}
    pieces = []
    for token in ids:
        raw = model.token_to_piece(token, True)
        try:
            piece: str | list[int] = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        pieces.append({"id": token, "piece": piece})
    return {"tokens": pieces}


def detokenize(served: ServedModel, request: Mapping[str, Any]) -> dict[str, Any]:
    """``/detokenize``: ``tokens`` to ``content``."""
    _check_object(request)
    tokens = request.get("tokens")
    if not isinstance(tokens, list):
        raise InvalidOptionError("tokens must be a list of token ids", option="tokens")
    ids = check_token_ids(served, tokens, where="tokens")
    return {"content": served.model.detokenize(ids, False, True)}


def apply_template(served: ServedModel, request: Mapping[str, Any]) -> dict[str, Any]:
    """``/apply-template``: the prompt a chat request renders to."""
    body = parse_body(ChatBody, request)
    chat = from_chat_body(body, engine=False)
    chat = dataclasses.replace(chat, messages=mark_media(chat.messages))  # media as markers
    return {"prompt": render_prompt(served, chat)}


def slot_n_ctx(served: ServedModel) -> int:
    """The context one request may use, as the engine enforces it (llama.cpp's
    ``n_ctx_seq``): all of it with a unified KV cache (llamapy's default), else the slot's
    share; the ``n_ctx`` of a context overflow error is the same number."""
    n_ctx_seq = served.n_ctx_seq()
    if n_ctx_seq:
        return n_ctx_seq
    start = served.server.start_options
    n_ctx = start.context.n_ctx
    return n_ctx if start.engine.kv_unified else n_ctx // start.server.n_parallel


def build_info() -> str:
    """llama-server's ``build_info``: ours and the llama.cpp commit we build."""
    return f"llamapy-{__version__}-llama.cpp-{LLAMA_CPP_COMMIT}"


def props(served: ServedModel) -> dict[str, Any]:
    """``/props``: default generation settings (with the per-slot ``n_ctx``), slot count,
    model, template, modalities and build."""
    start = served.server.start_options
    defaults = start.engine.sampling
    sampling = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(defaults)}
    sampling["logit_bias"] = dict(defaults.logit_bias)
    bos, eos = served.special_tokens()
    return {
        "default_generation_settings": {"id": 0, "id_task": -1, "n_ctx": slot_n_ctx(served),
                                        "is_processing": False, "params": sampling,
                                        "model": served.name},
        "total_slots": start.server.n_parallel,
        "is_sleeping": False,
        "model_alias": served.name,
        "model_path": served.server.model_path,
        "model_description": served.model.description,
        "chat_template": served.chat_templates().source,
        "chat_template_caps": served.chat_templates().caps,
        "bos_token": bos,
        "eos_token": eos,
        "modalities": {**served.server.modalities, "video": False},
        "media_marker": MEDIA_MARKER,
        "build_info": build_info(),
    }


def slots(served: ServedModel) -> list[dict[str, Any]]:
    """``/slots``: each slot's state, cached tokens and current request (``speculative``:
    whether the server drafts by default, as llama-server reports it)."""
    return slot_entries(served, served.server.slots())


def slot_entries(served: ServedModel, engine_slots: Iterable[Mapping[str, Any]]
                 ) -> list[dict[str, Any]]:
    """The ``/slots`` entries of the engine's slot snapshots (``stats()["slots"]``): shared by
    ``/slots`` and the live view's events, so both describe a slot alike."""
    n_ctx = slot_n_ctx(served)
    speculative = served.server.start_options.engine.speculative.enabled
    return [{"id": slot["slot_id"], "id_task": slot["request_id"] or -1, "n_ctx": n_ctx,
             "speculative": speculative, "is_processing": slot["request_id"] is not None,
             **slot}
            for slot in engine_slots]


def _check_object(request: object) -> None:
    if not isinstance(request, Mapping):
        raise InvalidOptionError("request body must be a JSON object")
