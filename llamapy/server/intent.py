"""What a generation call asks for, resolved once: :class:`GenerationIntent`.

Every way into a :class:`~llamapy.server.Server` ends here: ``**options`` keywords
(:meth:`Server.resolve`), and the API layers (OpenAI, Anthropic, Responses, Ollama,
llama-server's routes), which hand their fields to one resolver above the server and get back
this frozen value. The generation methods take it in place of keywords, so a request is
renamed, defaulted and checked exactly once, at the edge, and travels typed from there.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from ..adapters import resolve_adapters
from ..engine import resolve_request_options
from ..errors import InvalidOptionError, UnknownOptionError
from ..options import canonical_name
from ..options.limits import check_limits
from ..options.sampling import RequestOptions, SamplingParams, split_sampling
from ..runtime import new_request_id
from .options import ResolvedStart, call_option_keys

__all__ = ["DEFAULT_TIMEOUT", "GenerationIntent", "canonical_options", "deadline_of",
           "resolve_intent", "revise_intent"]


class _Default(enum.Enum):
    TIMEOUT = "the method's default timeout"


#: An intent's ``timeout`` when the call sets none: each method's own default applies.
DEFAULT_TIMEOUT: Final = _Default.TIMEOUT

#: The request options' own names (``sampling`` aside: its fields are options too).
_OWN = tuple(f.name for f in dataclasses.fields(RequestOptions) if f.name != "sampling")


@dataclass(frozen=True, slots=True)
class GenerationIntent:
    """One generation call's engine side, validated: the request options (sampling merged with
    the server's defaults, checked against its limits), the time budget and the request id.

    Build it with :meth:`Server.resolve` (or an API layer's resolver); change it only through
    :meth:`Server.revise`, which checks again. ``timeout`` is seconds (None: no bound) or
    :data:`DEFAULT_TIMEOUT` (the method's own); ``request_id`` None means a fresh id per call.
    """

    options: RequestOptions
    timeout: float | Literal[_Default.TIMEOUT] | None = DEFAULT_TIMEOUT
    request_id: Hashable | None = None

    def timeout_or(self, default: float | None) -> float | None:
        """The call's timeout, ``default`` when it sets none."""
        return default if self.timeout is DEFAULT_TIMEOUT else self.timeout

    def new_id(self) -> Hashable:
        """The request id to submit under (a fresh one when none was given)."""
        return new_request_id() if self.request_id is None else self.request_id

    def settings(self) -> dict[str, Any]:
        """Every option as a flat ``name -> value`` mapping (the request options, then the
        sampling ones), in JSON-friendly shapes: what llama-server reports as a request's
        ``generation_settings``."""
        out: dict[str, Any] = {name: getattr(self.options, name) for name in _OWN}
        sampling = self.options.sampling
        out.update((f.name, getattr(sampling, f.name)) for f in dataclasses.fields(sampling))
        out["speculative"] = None if out["speculative"] is None else dict(out["speculative"])
        out["logit_bias"] = dict(out["logit_bias"])
        return out


def canonical_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` under their canonical names (``temperature`` -> ``temp``, ``n_predict`` ->
    ``max_tokens``): one option given under two spellings is an ``InvalidOptionError``, an
    unknown key an ``UnknownOptionError``."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, value in options.items():
        name = canonical_name(key)
        if name in out:
            raise InvalidOptionError(f"{name}: given twice, as {given[name]!r} and {key!r}",
                                     option=name)
        out[name], given[name] = value, key
    unknown = set(out) - set(call_option_keys())
    if unknown:
        raise UnknownOptionError({given[k] for k in unknown}, call_option_keys(),
                                 where="request")
    return out


def _check_timeout(timeout: object) -> None:
    if timeout is None or timeout is DEFAULT_TIMEOUT:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
        raise InvalidOptionError(f"timeout: a number of seconds >= 0 or None, got {timeout!r}",
                                 option="timeout")


def resolve_intent(options: Mapping[str, Any], start: ResolvedStart) -> GenerationIntent:
    """Keyword ``options`` (any spelling, see :func:`canonical_options`) as a
    :class:`GenerationIntent` over the server's defaults and within its limits."""
    opts = canonical_options(options)
    timeout = opts.pop("timeout", DEFAULT_TIMEOUT)
    request_id = opts.pop("request_id", None)
    _check_timeout(timeout)
    if "adapters" in opts:
        opts["adapters"] = resolve_adapters(opts["adapters"])
    resolved = resolve_request_options(opts, defaults=start.engine.sampling)
    check_limits(resolved, start.engine)  # at the edge: the engine checks again
    return GenerationIntent(resolved, timeout, request_id)


def revise_intent(intent: GenerationIntent, changes: Mapping[str, Any], start: ResolvedStart
                  ) -> GenerationIntent:
    """``intent`` with some options changed (request or sampling options, any spelling), each
    checked as at :func:`resolve_intent`; unknown names raise ``UnknownOptionError``."""
    named = canonical_options(changes)
    if {"timeout", "request_id"} & set(named):
        raise InvalidOptionError("timeout and request_id are set when resolving, not revised",
                                 option="timeout")
    own, sampling = split_sampling(named, _OWN, "request")
    if "adapters" in own:
        own["adapters"] = resolve_adapters(own["adapters"])
    base: SamplingParams = intent.options.sampling
    options = dataclasses.replace(intent.options, **own,
                                  sampling=dataclasses.replace(base, **sampling))
    check_limits(options, start.engine)
    return dataclasses.replace(intent, options=options)


def deadline_of(timeout: float | None, per_event: bool) -> float | None:
    """The ``time.monotonic()`` instant a whole call must end by (None: per event or none)."""
    return None if per_event or timeout is None else time.monotonic() + timeout
