"""OpenAI text completions (``/v1/completions``): prompt as text, token ids, or a list of them.

Each prompt of a list is its own request and its own choice (``index``); the async form runs
them concurrently, so they batch together on the server. Streams send each prompt's chunks in
turn. ``echo`` prepends the prompt text; ``logprobs`` (an int, up to 20) reports that many
alternatives per generated token in the legacy shape.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from contextlib import aclosing, closing
from dataclasses import dataclass, field
from typing import Any

from ..engine import DoneEvent, ProgressEvent, StreamEvent
from ..errors import InvalidOptionError, UnsupportedFeatureError
from ..server import Completion, GenerationIntent, Usage
from .chat import Target, aready, ready
from .logprobs import MIN_CANDIDATES, legacy_logprobs
from .params import CompletionBody, api_extra, check_unsupported, parse_body, sampling_options
from .prompt import call_intent, new_id
from .report import (
    SYSTEM_FINGERPRINT,
    finish_reason,
    timings_dict,
    total_usage,
    usage_dict,
)
from .target import ServedModel


@dataclass(slots=True)
class CompletionPlan:
    """A text-completion request ready to run."""

    served: ServedModel
    body: CompletionBody
    prompts: list[Sequence[int]]
    texts: list[str]
    intents: list[GenerationIntent]
    id: str = field(default_factory=lambda: new_id("cmpl"))
    created: int = field(default_factory=lambda: int(time.time()))

    def envelope(self) -> dict[str, Any]:
        """Fields common to every response object."""
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.served.name, "system_fingerprint": SYSTEM_FINGERPRINT}


def check_token_ids(served: ServedModel, token_ids: Sequence[int], where: str = "prompt"
                    ) -> list[int]:
    """``token_ids`` as ints within the vocabulary (else :class:`InvalidOptionError`)."""
    n_vocab = served.model.n_vocab
    for token in token_ids:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < n_vocab:
            raise InvalidOptionError(f"{where}: {token!r} is not a token id in [0, {n_vocab})",
                                     option=where)
    return list(token_ids)


def prompt_list(served: ServedModel, prompt: object, n: int = 1
                ) -> list[tuple[Sequence[int], str]]:
    """Each prompt as ``(token_ids, text)``; ``n`` choices of each must fit the server's
    ``max_choices`` (checked before any prompt is tokenized)."""
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        items = [prompt]
    else:
        items = list(prompt) if isinstance(prompt, list) else []
    if not items:
        raise InvalidOptionError("prompt must not be empty", option="prompt")
    served.server.check_fits_at_once(len(items) * n)
    out = []
    for item in items:
        if isinstance(item, str):
            out.append((served.tokenize_prompt(item), item))
        elif isinstance(item, list):
            ids = check_token_ids(served, item)
            out.append((ids, served.model.detokenize(ids, False, True)))
        else:
            raise InvalidOptionError("prompt must be a string, token ids, or a list of them",
                                     option="prompt")
    return out


def prepare_completion(served: ServedModel, request: Mapping[str, Any]) -> CompletionPlan:
    """Validate a completion request and tokenize its prompts."""
    body = parse_body(CompletionBody, request)
    check_unsupported(body)
    served.check_model(body.model)
    if body.echo and body.logprobs is not None:
        raise UnsupportedFeatureError("echo+logprobs", "echo with logprobs (prompt logprobs) "
                                      "is unsupported")
    pairs = [pair for pair in prompt_list(served, body.prompt, body.n) for _ in range(body.n)]
    fields = sampling_options(body)
    if body.logprobs is not None:
        fields["n_probs"] = max(fields.get("n_probs", 0), body.logprobs, MIN_CANDIDATES)
    intents = []
    for index in range(0, len(pairs), body.n):  # choice i * n + j: prompt i, choice j
        intent = call_intent(served, api_extra(body, "ignore_eos"), fields, body.max_tokens,
                             len(pairs[index][0]))
        intents.extend(served.choices(intent, body.n))
    return CompletionPlan(served, body, [ids for ids, _ in pairs], [t for _, t in pairs],
                          intents)


def _choice(plan: CompletionPlan, index: int, completion: Completion) -> dict[str, Any]:
    body = plan.body
    prefix = plan.texts[index] if body.echo else ""
    logprobs = None if body.logprobs is None else legacy_logprobs(
        plan.served.model, completion.token_ids, completion.logprobs, body.logprobs,
        len(prefix))
    return {"index": index, "text": prefix + completion.text, "logprobs": logprobs,
            "finish_reason": finish_reason(completion.finish_reason)}


def completion_response(plan: CompletionPlan, completions: Sequence[Completion]
                        ) -> dict[str, Any]:
    """The ``text_completion`` object (one choice per prompt)."""
    model = plan.served.model
    return {**plan.envelope(),
            "choices": [_choice(plan, i, c) for i, c in enumerate(completions)],
            "usage": usage_dict(total_usage([c.usage for c in completions])),
            "timings": timings_dict(completions[0].timings, model, plan.prompts[0])}


class CompletionStream:
    """Turns the engine events of each prompt into ``text_completion`` chunks."""

    def __init__(self, plan: CompletionPlan) -> None:
        self.plan = plan
        self.usages: list[Usage] = []
        self.offset = 0

    def _chunk(self, index: int, text: str, finish: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return {**self.plan.envelope(), "choices": [choice]}

    def begin(self, index: int) -> list[dict[str, Any]]:
        """The echo chunk of prompt ``index``, if echo is on."""
        self.offset = 0
        if not self.plan.body.echo:
            return []
        self.offset = len(self.plan.texts[index])
        return [self._chunk(index, self.plan.texts[index])]

    def on_event(self, index: int, event: StreamEvent) -> list[dict[str, Any]]:
        """Chunks for one engine event of prompt ``index``."""
        if isinstance(event, DoneEvent):
            usage = Usage(event.prompt_tokens, event.completion_tokens,
                          event.timings.reused_tokens)
            self.usages.append(usage)
            final = self._chunk(index, "", finish_reason(event.finish_reason))
            final["usage"] = usage_dict(usage)  # llama-server's final chunk always has it
            final["timings"] = timings_dict(event.timings, self.plan.served.model,
                                            self.plan.prompts[index])
            return [final]
        if isinstance(event, ProgressEvent):  # llama-server's chat and native streams only
            return []
        top = self.plan.body.logprobs
        logprobs = None if top is None else legacy_logprobs(
            self.plan.served.model, [event.token_id], [event.logprobs or ()], top, self.offset)
        self.offset += len(event.text)
        if not event.text and logprobs is None:
            return []
        return [self._chunk(index, event.text, logprobs=logprobs)]

    def end(self) -> list[dict[str, Any]]:
        """The usage chunk, when ``stream_options.include_usage`` asks for it."""
        if not self.plan.body.include_usage():
            return []
        usage = usage_dict(total_usage(self.usages))
        return [{**self.plan.envelope(), "choices": [], "usage": usage}]


def completion(target: Target, request: Mapping[str, Any]) -> dict[str, Any]:
    """A ``text_completion`` for an OpenAI completion request (prompts run one by one)."""
    plan = prepare_completion(ready(target), request)
    done = [plan.served.complete(ids, opts) for ids, opts in zip(plan.prompts, plan.intents,
                                                                   strict=True)]
    return completion_response(plan, done)


def stream_completion(target: Target, request: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """``text_completion`` chunks as they are generated."""
    plan = prepare_completion(ready(target), request)
    return _stream(plan)


def _stream(plan: CompletionPlan) -> Iterator[dict[str, Any]]:
    stream = CompletionStream(plan)
    for index, (ids, opts) in enumerate(zip(plan.prompts, plan.intents, strict=True)):
        yield from stream.begin(index)
        with closing(plan.served.events(ids, opts)) as events:
            for event in events:
                yield from stream.on_event(index, event)
    yield from stream.end()


async def acompletion(target: Target, request: Mapping[str, Any]) -> dict[str, Any]:
    """Async :func:`completion`; the prompts run concurrently."""
    plan = await asyncio.to_thread(prepare_completion, await aready(target), request)
    done = await plan.served.acomplete_all(
        list(zip(plan.prompts, plan.intents, strict=True)))
    return completion_response(plan, done)


async def astream_completion(target: Target, request: Mapping[str, Any]
                             ) -> AsyncGenerator[dict[str, Any], None]:
    """Async :func:`stream_completion`; closing the iterator cancels the running request."""
    plan = await asyncio.to_thread(prepare_completion, await aready(target), request)
    stream = CompletionStream(plan)
    for index, (ids, opts) in enumerate(zip(plan.prompts, plan.intents, strict=True)):
        for chunk in stream.begin(index):
            yield chunk
        async with aclosing(plan.served.aevents(ids, opts)) as events:
            async for event in events:
                for chunk in stream.on_event(index, event):
                    yield chunk
    for chunk in stream.end():
        yield chunk
