"""The lazy grammar of offered tools on the real vocabulary: free text until the model opens a
call, then only a declared tool's name (the grammar and trigger llama.cpp's chat layer makes for
the Hermes stand-in format, watched by llamapy's own lazy grammar)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llamapy._native import Batch, Context, Model, SamplerChain
from llamapy.chat.layer import HERMES_TOOLS_TEMPLATE, source_templates
from llamapy.lazy_grammar import MAX_FAILED_ARMS, LazyGrammar
from llamapy.llama_sampler import LlamaSampler

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"location": {"type": "string"}},
    "required": ["location"]}}}]


def offered_grammar() -> tuple[str, tuple[str, ...]]:
    """The chat layer's lazy grammar of :data:`TOOLS` offered, and its trigger (a word with no
    regex metacharacters, so it is its own pattern)."""
    params = source_templates(HERMES_TOOLS_TEMPLATE).apply({
        "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": "auto"})
    assert params.grammar_lazy and [t.kind for t in params.triggers] == ["word"]
    return params.grammar, tuple(t.value for t in params.triggers)


@pytest.fixture
def ctx(model: Model) -> Iterator[Context]:
    with Context(model, n_ctx=512, n_batch=256, n_seq_max=1, n_threads=2) as c:
        yield c


def lazy_sampler(model: Model, ctx: Context, grammar: str, triggers: tuple[str, ...]
                 ) -> LlamaSampler:
    """A greedy sampler whose grammar waits for ``triggers`` (llamapy's own watch)."""
    return LlamaSampler(SamplerChain(model).add_greedy(), ctx,
                        lazy=LazyGrammar(model, grammar, "root", triggers))


def greedy_after(model: Model, ctx: Context, sampler: LlamaSampler, text: str, n: int) -> str:
    """``text`` decoded and accepted as the model's own output, then ``n`` greedy tokens."""
    tokens = model.tokenize(text)
    for tok in tokens:
        sampler.accept(tok)
    batch = Batch(256)
    row = batch.add(0, 0, tokens)
    ctx.decode(batch)
    out, pos = [], len(tokens)
    for _ in range(n):
        tok = sampler.sample(row)
        if model.is_eog(tok):
            break
        out.append(tok)
        batch.clear()
        row = batch.add(0, pos, [tok])
        pos += 1
        ctx.decode(batch)
    return model.detokenize(out)


def test_an_opened_call_can_only_name_a_declared_tool(model: Model, ctx: Context) -> None:
    grammar, triggers = offered_grammar()
    sampler = lazy_sampler(model, ctx, grammar, triggers)
    try:
        text = greedy_after(model, ctx, sampler, 'I will call it.\n<tool_call>\n{"name": "', 12)
    finally:
        sampler.close()
    assert text.startswith('get_weather"'), text


def test_text_without_the_trigger_is_left_free(model: Model, ctx: Context) -> None:
    grammar, triggers = offered_grammar()
    sampler = lazy_sampler(model, ctx, grammar, triggers)
    try:
        lazy = greedy_after(model, ctx, sampler, "The capital of France is", 4)
    finally:
        sampler.close()
    ctx.clear()
    free_sampler = LlamaSampler(SamplerChain(model).add_greedy(), ctx)
    try:
        free = greedy_after(model, ctx, free_sampler, "The capital of France is", 4)
    finally:
        free_sampler.close()
    assert lazy == free and lazy


def test_a_trigger_inside_a_token_starts_the_grammar_at_the_match(model: Model,
                                                                   ctx: Context) -> None:
    """The grammar reads only the text from the match on: a token that begins before the
    match (here one whose text ends in ``<``) is replayed behind a literal of its head."""
    grammar = 'root ::= "<<" [0-9] [0-9] [0-9]'
    sampler = lazy_sampler(model, ctx, grammar, ("<<",))
    try:
        text = greedy_after(model, ctx, sampler, "Write three digits: <<", 3)
    finally:
        sampler.close()
    assert text[:3].isdigit(), text


def test_a_match_the_grammar_cannot_read_leaves_the_output_free(model: Model,
                                                              ctx: Context) -> None:
    """The token that completes the trigger runs past what the grammar allows (`` about``
    for a grammar of ``abc``): no error, the request goes on unconstrained and the watch starts
    again, so a later match arms the grammar."""
    sampler = lazy_sampler(model, ctx, 'root ::= "ab" "c"', ("ab",))
    try:
        assert model.detokenize(model.tokenize("Think about")[-1:]) == " about"
        assert greedy_after(model, ctx, sampler, "Think about", 3)  # sampling went on, free
        ctx.clear()
        more = greedy_after(model, ctx, sampler, "Now ab", 1)
    finally:
        sampler.close()
    assert more == "c"


def test_after_three_matches_the_grammar_cannot_read_the_watch_stops(model: Model,
                                                                   ctx: Context) -> None:
    """Each failed match re-arms nothing and costs the model's thread: after three the rest
    of the output is free for good."""
    sampler = lazy_sampler(model, ctx, 'root ::= "ab" "c"', ("ab",))
    try:
        for _ in range(MAX_FAILED_ARMS):
            assert sampler._lazy is not None
            greedy_after(model, ctx, sampler, "Think about", 1)
            ctx.clear()
        assert sampler._lazy is None
    finally:
        sampler.close()
