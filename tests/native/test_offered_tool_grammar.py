"""The lazy grammar of offered tools on the real vocabulary: free text until the model opens a
call, then only a declared tool's name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llamapy._native import Batch, Context, Model, SamplerChain
from llamapy.grammar import offered_tool_grammar

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"location": {"type": "string"}},
    "required": ["location"]}}}]


@pytest.fixture
def ctx(model: Model) -> Iterator[Context]:
    with Context(model, n_ctx=512, n_batch=256, n_seq_max=1, n_threads=2) as c:
        yield c


def greedy_after(model: Model, ctx: Context, chain: SamplerChain, text: str, n: int) -> str:
    """``text`` decoded and accepted as the model's own output, then ``n`` greedy tokens."""
    tokens = model.tokenize(text)
    for tok in tokens:
        chain.accept(tok)
    batch = Batch(256)
    row = batch.add(0, 0, tokens)
    ctx.decode(batch)
    out, pos = [], len(tokens)
    for _ in range(n):
        tok = chain.sample(ctx, row)
        if model.is_eog(tok):
            break
        out.append(tok)
        batch.clear()
        row = batch.add(0, pos, [tok])
        pos += 1
        ctx.decode(batch)
    return model.detokenize(out)


def test_an_opened_call_can_only_name_a_declared_tool(model: Model, ctx: Context) -> None:
    grammar, triggers = offered_tool_grammar(TOOLS, "hermes")
    with SamplerChain(model) as chain:
        chain.add_grammar(grammar, lazy_patterns=triggers).add_greedy()
        text = greedy_after(model, ctx, chain, 'I will call it.\n<tool_call>\n{"name": "', 12)
    assert text.startswith('get_weather"'), text


def test_text_without_the_trigger_is_left_free(model: Model, ctx: Context) -> None:
    grammar, triggers = offered_tool_grammar(TOOLS, "hermes")
    with SamplerChain(model) as chain:
        chain.add_grammar(grammar, lazy_patterns=triggers).add_greedy()
        lazy = greedy_after(model, ctx, chain, "The capital of France is", 4)
    ctx.clear()
    with SamplerChain(model) as chain:
        free = greedy_after(model, ctx, chain.add_greedy(), "The capital of France is", 4)
    assert lazy == free and lazy
