"""A lazy grammar's trigger, watched in Python: ``LazyGrammar``.

A request with ``grammar_triggers`` samples freely until a trigger pattern matches the output.
libllama's own lazy grammar would match the patterns with ``std::regex`` on every token; here
the chain starts without the grammar, :class:`~llamapy.grammar.triggers.TriggerWatch` matches
the patterns in linear time against a bounded tail, and when one matches, the chain is rebuilt
with the grammar first, having read the matched text, then copies of the chain's samplers with
their state (penalty history, RNG).

The grammar is parsed once, when the request's sampler is built (off the model's thread for a
request with a grammar, and a bad grammar is refused then); arming copies that parsed grammar
and feeds it tokens whose text is exactly the matched text: the tokens from the match on, where
the match starts inside a token that token's tail tokenized anew. Only when that tail does not
tokenize back to itself is a grammar with a literal of the token's head parsed, and only for a
grammar of at most :data:`REPARSE_MAX_CHARS` characters (a longer parse would hold the model's
thread).

When the grammar cannot read the matched text (the token that completed the trigger ran past
what the grammar allows there), the output stays free and the watch starts again from the next
token, as if that match had not been made; after :data:`MAX_FAILED_ARMS` such matches the
watch stops and the rest of the output is free.
"""

from __future__ import annotations

from ._native import Model, SamplerChain
from .errors import GrammarError
from .grammar.triggers import TriggerHit, TriggerWatch, prefixed_grammar
from .options.triggers import compile_triggers

__all__ = ["MAX_FAILED_ARMS", "REPARSE_MAX_CHARS", "LazyGrammar"]

#: Matches the grammar could not read before the watch stops for good.
MAX_FAILED_ARMS = 3
#: The longest grammar parsed again at a match (see the module).
REPARSE_MAX_CHARS = 16_384


class LazyGrammar:
    """The pending grammar of one request and the watch for its trigger; :meth:`close` frees
    the parsed grammar."""

    __slots__ = ("_failures", "_grammar", "_model", "_parsed", "_root", "_watch")

    def __init__(self, model: Model, grammar: str, root: str, patterns: tuple[str, ...]) -> None:
        self._watch = TriggerWatch(compile_triggers(patterns))
        self._parsed = SamplerChain(model)
        try:
            self._parsed.add_grammar(grammar, root)  # or GrammarError
        except BaseException:
            self._parsed.close()
            raise
        self._model, self._grammar, self._root = model, grammar, root
        self._failures = 0

    def watch(self, token: int) -> TriggerHit | None:
        """Feed one output token; the replay when the trigger now matches. An end-of-generation
        token is not watched (a grammar never reads one it did not allow)."""
        if self._model.is_eog(token):
            return None
        return self._watch.feed(token, self._model.token_to_piece(token))

    def failed(self) -> bool:
        """A match the grammar could not read: forget the output watched so far; whether to
        keep watching (False after :data:`MAX_FAILED_ARMS` failures)."""
        self._failures += 1
        self._watch.clear()
        return self._failures < MAX_FAILED_ARMS

    def armed(self, chain: SamplerChain, hit: TriggerHit) -> SamplerChain:
        """A new chain: the grammar, having read the matched text, then copies of ``chain``'s
        samplers. ``chain`` is left as it was (the caller closes the one it drops); a grammar
        that cannot read the matched text raises the typed error of the refusing call."""
        replay = self._replay(hit)
        armed = SamplerChain(self._model)
        try:
            if replay is not None:
                armed.add_copy(self._parsed, 0, replay=replay)
            else:
                self._add_reparsed(armed, hit)
            armed.add_copies(chain)
        except BaseException:
            armed.close()
            raise
        return armed

    def close(self) -> None:
        """Free the parsed grammar (idempotent)."""
        self._parsed.close()

    def _replay(self, hit: TriggerHit) -> list[int] | None:
        """Tokens whose text is exactly the matched text, or None when the first token's tail
        does not tokenize back to itself."""
        if not hit.prefix:
            return list(hit.tokens)
        model = self._model
        tail = model.token_to_piece(hit.tokens[0])[len(hit.prefix):]
        try:
            ids = model.tokenize(tail.decode("utf-8"), False, False)
        except UnicodeDecodeError:
            return None
        if b"".join(model.token_to_piece(t) for t in ids) != tail:
            return None
        return [*ids, *hit.tokens[1:]]

    def _add_reparsed(self, armed: SamplerChain, hit: TriggerHit) -> None:
        """The grammar behind a literal of the first token's head, parsed now (small ones)."""
        if len(self._grammar) > REPARSE_MAX_CHARS:
            raise GrammarError("the match starts inside a token the grammar cannot read "
                               "from its middle")
        text, root = prefixed_grammar(self._grammar, self._root, hit.prefix)
        armed.add_grammar(text, root, replay=hit.tokens)
