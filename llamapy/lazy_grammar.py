"""A lazy grammar's trigger, watched in Python: ``LazyGrammar``.

A request with ``grammar_triggers`` samples freely until a trigger pattern matches the output.
libllama's own lazy grammar would match the patterns with ``std::regex`` on every token; here
the chain starts without the grammar, :class:`~llamapy.grammar.triggers.TriggerWatch` matches
the patterns in linear time against a bounded tail, and when one matches, the chain is rebuilt
with the grammar first: the grammar reads the matched text (the replayed tokens, after a literal
for the part of the first token before the match), then the copies of the chain's samplers
follow with their state (penalty history, RNG).

The grammar text is parsed once when the request starts, so a bad grammar is refused then.
When the text from the match on cannot be read by the grammar (the token that completed the
trigger ran past what the grammar allows there), the output stays free and the watch starts
again from the next token: the request goes on, as if that match had not been made.
"""

from __future__ import annotations

from ._native import Model, SamplerChain
from .grammar.triggers import TriggerHit, TriggerWatch, prefixed_grammar
from .options.triggers import compile_triggers

__all__ = ["LazyGrammar"]


class LazyGrammar:
    """The pending grammar of one request and the watch for its trigger."""

    __slots__ = ("_grammar", "_model", "_root", "_watch")

    def __init__(self, model: Model, grammar: str, root: str, patterns: tuple[str, ...]) -> None:
        SamplerChain(model).add_grammar(grammar, root).close()  # parses, or GrammarError
        self._model, self._grammar, self._root = model, grammar, root
        self._watch = TriggerWatch(compile_triggers(patterns))

    def watch(self, token: int) -> TriggerHit | None:
        """Feed one output token; the replay when the trigger now matches. An end-of-generation
        token is not watched (a grammar never reads one it did not allow)."""
        if self._model.is_eog(token):
            return None
        return self._watch.feed(token, self._model.token_to_piece(token))

    def restart(self) -> None:
        """Forget the output watched so far (a match the grammar could not read)."""
        self._watch.clear()

    def armed(self, chain: SamplerChain, hit: TriggerHit) -> SamplerChain:
        """A new chain: the grammar, having read the matched text, then copies of ``chain``'s
        samplers. ``chain`` is left as it was (the caller closes the one it drops); a grammar
        that cannot read the matched text raises the typed error of the refusing call."""
        text, root = prefixed_grammar(self._grammar, self._root, hit.prefix)
        armed = SamplerChain(self._model)
        try:
            armed.add_grammar(text, root, replay=hit.tokens)
            armed.add_copies(chain)
        except BaseException:
            armed.close()
            raise
        return armed
