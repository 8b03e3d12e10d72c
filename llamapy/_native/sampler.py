"""``SamplerChain``: llama.cpp's native samplers composed in a chain the chain owns.

The calls that can throw from a request's input (sampling, accepting, adding to the chain, the
grammar, penalty, DRY and logit-bias constructors) go through llamapy's shim (:mod:`._shim`)
and raise their typed error. A constructor that fails leaves the chain as it was; a sample or
an accept that fails leaves it failed (a grammar may be half-advanced), so that nothing but
:meth:`SamplerChain.close` touches it again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import ClosedError, GrammarError, LlamapyError, NativeError
from . import _logging
from ._loader import native
from ._shim import WHAT_SIZE, check_error, shim_error
from .context import Context
from .model import Model
from .owned import Owned, not_null

DEFAULT_SEED = 0xFFFFFFFF


class SamplerChain(Owned):
    """A chain of native samplers. Add samplers in order, then ``sample(ctx, row)``.

    Each ``add_*`` call creates a native sampler that the chain owns from then on. ``sample``
    applies the chain to a batch row's logits, picks a token and accepts it into every sampler
    (so penalties, grammar and mirostat state advance). ``close()`` frees the chain. After a
    native failure (see the module docstring) every use but ``close()`` raises.
    """

    KIND = "sampler chain"

    def __init__(self, model: Model, *, no_perf: bool = True) -> None:
        lib = native().lib
        params = lib.llama_sampler_chain_default_params()
        params.no_perf = no_perf
        self._start(model, lib.llama_sampler_chain_init(params), [])

    @classmethod
    def _wrap(cls, model: Model, ptr: Any, names: list[str]) -> SamplerChain:
        self = cls.__new__(cls)
        self._start(model, ptr, names)
        return self

    def _start(self, model: Model, ptr: Any, names: list[str]) -> None:
        ffi = native().ffi
        self.model, self._ptr, self.names = model, ptr, list(names)
        self._failure: LlamapyError | None = None
        self._what = ffi.new("char[]", WHAT_SIZE)  # the shim's message buffer, reused
        self._token = ffi.new("llama_token *")

    @property
    def ptr(self) -> Any:
        """The raw ``llama_sampler *`` of the chain (closed or failed chains raise)."""
        if self._ptr is None:
            raise ClosedError(f"{self.KIND} is closed")
        if self._failure is not None:
            raise NativeError(f"sampler chain failed earlier ({self._failure}); close it")
        return self._ptr

    def _check(self, status: int, function: str) -> None:
        """Fail the chain with the shim's error for ``status`` (nothing for success)."""
        if status:
            what = native().ffi.string(self._what).decode("utf-8", "replace")
            self._failure = shim_error(status, what, function)
            raise self._failure

    def _make(self, function: str, make: Callable[[Any], int]) -> Any:
        """A sampler from the shim's wrapper of the constructor ``function``."""
        out = native().ffi.new("struct llama_sampler **")
        check_error(make(out), self._what, function)
        return out[0]

    def _add(self, name: str, smpl: Any) -> SamplerChain:
        nat = native()
        not_null(smpl, lambda: GrammarError(f"failed to create sampler {name}"))
        status = nat.shim.llamapy_sampler_chain_add(self.ptr, smpl, self._what, WHAT_SIZE)
        if status:
            nat.lib.llama_sampler_free(smpl)  # not the chain's
        check_error(status, self._what, "llama_sampler_chain_add")
        self.names.append(name)
        return self

    # --- samplers (each returns self, so calls chain) ----------------------------------------

    def add_greedy(self) -> SamplerChain:
        """Pick the most likely token."""
        return self._add("greedy", native().lib.llama_sampler_init_greedy())

    def add_dist(self, seed: int = DEFAULT_SEED) -> SamplerChain:
        """Sample from the distribution with an RNG seeded by ``seed`` (-1 = random)."""
        return self._add("dist", native().lib.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def add_top_k(self, k: int) -> SamplerChain:
        """Keep the ``k`` most likely tokens."""
        return self._add("top_k", native().lib.llama_sampler_init_top_k(k))

    def add_top_p(self, p: float, min_keep: int = 1) -> SamplerChain:
        """Nucleus sampling."""
        return self._add("top_p", native().lib.llama_sampler_init_top_p(p, min_keep))

    def add_min_p(self, p: float, min_keep: int = 1) -> SamplerChain:
        """Drop tokens below ``p`` times the top probability."""
        return self._add("min_p", native().lib.llama_sampler_init_min_p(p, min_keep))

    def add_typical(self, p: float, min_keep: int = 1) -> SamplerChain:
        """Locally typical sampling."""
        return self._add("typical", native().lib.llama_sampler_init_typical(p, min_keep))

    def add_temp(self, t: float) -> SamplerChain:
        """Scale logits by 1/t."""
        return self._add("temp", native().lib.llama_sampler_init_temp(t))

    def add_temp_ext(self, t: float, delta: float, exponent: float) -> SamplerChain:
        """Dynamic temperature (entropy-based) in ``[t - delta, t + delta]``."""
        return self._add("temp_ext", native().lib.llama_sampler_init_temp_ext(t, delta, exponent))

    def add_xtc(self, p: float, t: float, min_keep: int = 1, seed: int = DEFAULT_SEED
                ) -> SamplerChain:
        """Exclude-top-choices sampling."""
        lib = native().lib
        return self._add("xtc", lib.llama_sampler_init_xtc(p, t, min_keep, seed & 0xFFFFFFFF))

    def add_top_n_sigma(self, n: float) -> SamplerChain:
        """Keep tokens within ``n`` standard deviations of the top logit."""
        return self._add("top_n_sigma", native().lib.llama_sampler_init_top_n_sigma(n))

    def add_mirostat(self, tau: float, eta: float, m: int = 100, seed: int = DEFAULT_SEED
                     ) -> SamplerChain:
        """Mirostat v1 (selects the token itself: put it last)."""
        lib = native().lib
        smpl = lib.llama_sampler_init_mirostat(self.model.n_vocab, seed & 0xFFFFFFFF, tau, eta, m)
        return self._add("mirostat", smpl)

    def add_mirostat_v2(self, tau: float, eta: float, seed: int = DEFAULT_SEED) -> SamplerChain:
        """Mirostat v2 (selects the token itself: put it last)."""
        lib = native().lib
        return self._add("mirostat_v2",
                         lib.llama_sampler_init_mirostat_v2(seed & 0xFFFFFFFF, tau, eta))

    def add_penalties(self, last_n: int, repeat: float, freq: float, present: float
                      ) -> SamplerChain:
        """Repetition, frequency and presence penalties over the last ``last_n`` tokens."""
        shim, n_vocab, what = native().shim, self.model.n_vocab, self._what
        return self._add("penalties", self._make(
            "llama_sampler_init_penalties", lambda out: shim.llamapy_sampler_init_penalties(
                n_vocab, last_n, repeat, freq, present, out, what, WHAT_SIZE)))

    def add_dry(self, multiplier: float, base: float, allowed_length: int, penalty_last_n: int,
                sequence_breakers: Sequence[str] = ()) -> SamplerChain:
        """DRY ("don't repeat yourself") sampling."""
        ffi, shim, vocab, what = native().ffi, native().shim, self.model.vocab, self._what
        keep = [ffi.new("char[]", s.encode()) for s in sequence_breakers]
        arr = ffi.new("const char *[]", keep or 1)
        return self._add("dry", self._make(
            "llama_sampler_init_dry", lambda out: shim.llamapy_sampler_init_dry(
                vocab, multiplier, base, allowed_length, penalty_last_n, arr, len(keep), out,
                what, WHAT_SIZE)))

    def add_logit_bias(self, bias: Mapping[int, float]) -> SamplerChain:
        """Add ``bias[token]`` to token logits."""
        ffi, shim, n_vocab, what = native().ffi, native().shim, self.model.n_vocab, self._what
        arr = ffi.new("llama_logit_bias[]", max(1, len(bias)))
        for i, (tok, b) in enumerate(bias.items()):
            arr[i].token, arr[i].bias = int(tok), float(b)
        return self._add("logit_bias", self._make(
            "llama_sampler_init_logit_bias", lambda out: shim.llamapy_sampler_init_logit_bias(
                n_vocab, len(bias), arr, out, what, WHAT_SIZE)))

    def add_reasoning_budget(self, start: Sequence[int], ends: Sequence[Sequence[int]],
                             forced: Sequence[int], budget: int) -> SamplerChain:
        """llama.cpp's reasoning budget: past ``budget`` tokens of a reasoning block (opened
        by ``start``, or already open when ``start`` is empty; closed by any of ``ends``), the
        tokens of ``forced`` (a message and an end tag) are forced one by one."""
        ffi, shim, vocab, what = native().ffi, native().shim, self.model.vocab, self._what
        flat = [t for seq in ends for t in seq]
        start_a = ffi.new("llama_token[]", list(start) or 1)
        ends_a = ffi.new("llama_token[]", flat or 1)
        lens_a = ffi.new("size_t[]", [len(seq) for seq in ends] or 1)
        forced_a = ffi.new("llama_token[]", list(forced) or 1)
        return self._add("reasoning_budget", self._make(
            "common_reasoning_budget_init",
            lambda out: shim.llamapy_sampler_init_reasoning_budget(
                vocab, start_a, len(start), ends_a, lens_a, len(ends), forced_a, len(forced),
                budget, out, what, WHAT_SIZE)))

    def add_grammar(self, grammar: str, root: str = "root", *, replay: Sequence[int] = ()
                    ) -> SamplerChain:
        """Constrain output to a GBNF grammar; invalid grammars raise :class:`GrammarError`.

        ``replay`` tokens are fed to the grammar alone before it joins the chain (a grammar
        that starts part-way through the output); a token it refuses raises the shim's typed
        error and leaves the chain as it was.
        """
        shim, vocab, what = native().shim, self.model.vocab, self._what
        text, start = grammar.encode(), root.encode()
        with _logging.capture() as lines, _logging.capture_stderr() as err:
            smpl = self._make("llama_sampler_init_grammar", lambda out: (
                shim.llamapy_sampler_init_grammar(vocab, text, start, out, what, WHAT_SIZE)))
        not_null(smpl, lambda: GrammarError(_logging.captured_message(
            [line for line in err if "error parsing grammar" in line] or lines,
            "failed to parse grammar")))
        return self._add_replayed("grammar", smpl, replay)

    def add_copy(self, other: SamplerChain, index: int, *, replay: Sequence[int] = ()
                 ) -> SamplerChain:
        """Append a copy of ``other``'s sampler ``index`` with its state (history, RNG,
        grammar stacks), fed ``replay`` alone first (as :meth:`add_grammar`)."""
        lib = native().lib
        smpl = lib.llama_sampler_clone(lib.llama_sampler_chain_get(other.ptr, index))
        return self._add_replayed(other.names[index], smpl, replay)

    def add_copies(self, other: SamplerChain) -> SamplerChain:
        """Append a copy of each of ``other``'s samplers, with its state (history, RNG)."""
        for i in range(len(other.names)):
            self.add_copy(other, i)
        return self

    def _add_replayed(self, name: str, smpl: Any, replay: Sequence[int]) -> SamplerChain:
        """Feed ``replay`` to ``smpl`` (a typed error frees it), then add it."""
        shim, what = native().shim, self._what
        try:
            for token in replay:
                check_error(shim.llamapy_sampler_accept(smpl, token, what, WHAT_SIZE), what,
                            "llama_sampler_accept")
        except BaseException:
            native().lib.llama_sampler_free(smpl)
            raise
        return self._add(name, smpl)

    # --- use ---------------------------------------------------------------------------------

    def sample(self, ctx: Context, index: int = -1) -> int:
        """Sample a token from batch row ``index`` of the last decode and accept it.

        :class:`~llamapy.errors.NoCandidateError` when the samplers exclude every token (then
        nothing is accepted); other native failures raise their typed error (:mod:`._shim`).
        """
        status = native().shim.llamapy_sampler_sample(self.ptr, ctx.ptr, index, self._token,
                                                      self._what, WHAT_SIZE)
        self._check(status, "llama_sampler_sample")
        return int(self._token[0])

    def accept(self, token: int) -> None:
        """Feed a token (e.g. a prompt token) to the samplers' state without sampling."""
        status = native().shim.llamapy_sampler_accept(self.ptr, token, self._what, WHAT_SIZE)
        self._check(status, "llama_sampler_accept")

    def reset(self) -> None:
        """Reset every sampler's state (penalty history, grammar, RNG stays seeded)."""
        native().lib.llama_sampler_reset(self.ptr)

    def clone(self) -> SamplerChain:
        """An independent copy of the chain with its current state."""
        return SamplerChain._wrap(self.model, native().lib.llama_sampler_clone(self.ptr),
                                  self.names)

    def __len__(self) -> int:
        return int(native().lib.llama_sampler_chain_n(self.ptr))

    def _free(self, ptr: Any) -> None:
        """Free the chain and every sampler in it."""
        native().lib.llama_sampler_free(ptr)
