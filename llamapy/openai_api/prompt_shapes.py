"""llama-server's ``prompt`` shapes (``/completion``), each prompt as ``(token ids, text)``.

One prompt: a string; token ids; a *mixed* list of token ids and strings (``[12, "text", 34]``:
each string tokenized in place, with BOS only when it comes first); or an object
``{"prompt_string": ...}`` (whose value may be any of these) with, for a model with a
projector, ``multimodal_data``: base64 images or audio, one for each media marker of a string
``prompt_string``. Several prompts: a list without token ids at its top level whose
items are each one prompt (``["a", [1, 2], {"prompt_string": "b"}]``). Token ids must be in
the vocabulary; anything else is a 400.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InvalidOptionError
from ..media.sources import MediaBudget, media_from_base64
from .completions import check_token_ids
from .target import ServedModel

__all__ = ["MULTIMODAL_KEY", "PROMPT_STRING_KEY", "media_input", "native_prompts"]

#: The key of llama-server's JSON prompt object.
PROMPT_STRING_KEY = "prompt_string"
MULTIMODAL_KEY = "multimodal_data"


def native_prompts(served: ServedModel, prompt: object) -> list[tuple[Sequence[int], str]]:
    """Every prompt of a ``/completion`` ``prompt`` field (see the module)."""
    if isinstance(prompt, list) and not any(_is_id(p) for p in prompt):
        items: list[object] = list(prompt)
    else:
        items = [prompt]
    if not items:
        raise InvalidOptionError("prompt must not be empty", option="prompt")
    served.server.check_fits_at_once(len(items))  # before any is tokenized
    budget = MediaBudget(served.limits.max_media_items)  # all the prompts together
    return [_one(served, item, budget) for item in items]


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _one(served: ServedModel, prompt: object, budget: MediaBudget
         ) -> tuple[Sequence[int], str]:
    """One prompt: a string, token ids, a mixed list or a ``prompt_string`` object."""
    if isinstance(prompt, Mapping) and PROMPT_STRING_KEY in prompt:
        if prompt.get(MULTIMODAL_KEY):
            text = prompt[PROMPT_STRING_KEY]
            return media_input(served, text, prompt[MULTIMODAL_KEY], budget=budget), str(text)
        prompt = prompt[PROMPT_STRING_KEY]
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidOptionError("prompt must not be empty", option="prompt")
        return served.tokenize_prompt(prompt), prompt
    if isinstance(prompt, list) and prompt and all(_is_id(p) or isinstance(p, str)
                                                  for p in prompt):
        ids = _mixed(served, prompt)
        return ids, served.model.detokenize(ids, False, True)
    raise InvalidOptionError("prompt elements must be a string, a list of token ids, a "
                             "{\"prompt_string\": ...} object, or a list of token ids and "
                             "strings", option="prompt")


def media_input(served: ServedModel, text: object, data: object, *,
                parse_special: bool = True, budget: MediaBudget) -> Sequence[int]:
    """A ``prompt_string`` with its ``multimodal_data`` (base64 items, one per marker) as the
    projector's prompt (``parse_special``: the prompt's special tokens are parsed, as a
    completion's are; an embedding input's are not)."""
    if not isinstance(text, str) or not text:
        raise InvalidOptionError("with multimodal_data, prompt_string must be a non-empty "
                                 "string", option="prompt")
    if not isinstance(data, list):
        raise InvalidOptionError("multimodal_data must be a list of base64 strings",
                                 option=MULTIMODAL_KEY)
    media = []
    for i, item in enumerate(data):
        budget.take()
        media.append(media_from_base64(item, served.limits.max_media_bytes,
                                       f"{MULTIMODAL_KEY}[{i}]"))
    if parse_special:
        return served.tokenize_prompt(text, media)
    return served.server.media_prompt(text, media, parse_special=False, tenant=served.tenant)


def _mixed(served: ServedModel, items: list[Any]) -> list[int]:
    """Token ids of a list of ids and strings (BOS only before a leading string)."""
    ids: list[int] = []
    for position, item in enumerate(items):
        if isinstance(item, str):
            ids += (served.tokenize_prompt(item) if position == 0 else
                    served.model.tokenize(item, False, True))
        else:
            ids += check_token_ids(served, [item])
    return ids
