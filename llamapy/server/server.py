"""``Server``: continuous-batching generation on one model, with a sync and an asyncio API.

A dedicated thread (:class:`~llamapy.runtime.loop.TickLoop`) loads the model and runs the
engine's tick loop; every public method is thread-safe and talks to it through the runtime.
Requests are read through the one event client (:mod:`llamapy.runtime.client`). The class is
assembled from :mod:`llamapy.server.core` (lifecycle, validation, waiting for the load),
:mod:`llamapy.server.aio` (the asyncio twins) and the blocking calls below.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..runtime import (
    Collector,
    Completion,
    EventStream,
    Hosted,
    RequestStream,
    TextChunks,
)
from .aio import AsyncMethods
from .calls import Call, prompt_ids
from .intent import GenerationIntent
from .loop import load_server
from .options import ResolvedStart
from .pooled import PooledMethods

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..options.typed import GenerationOptions

__all__ = ["Server"]


class Server(AsyncMethods, PooledMethods):
    """Serve one GGUF model to many concurrent callers.

    ``Server(model_path, **options)`` returns at once; the model loads in the background
    (:meth:`try_model` returns it or None, :meth:`fetch_model` raises the typed reason it is
    unavailable, :meth:`wait_ready` blocks). Options and defaults are
    those of :func:`~llamapy.server.start_option_keys`: ``n_ctx`` 8192 shared across slots,
    ``n_parallel`` 4, ``n_batch`` ``min(n_ctx, 2048)``, ``chunk_size`` 512, ``max_queue`` 64
    (0 = unlimited), ``cache_prompt`` True, ``kv_unified`` True, ``prompt_cache_ram_mb`` 0,
    ``prompt_cache_dir`` None (the disk prompt cache: kept across restarts; closing the server
    writes its slots' and RAM cache's prefixes there), ``batch_strategy``
    ``"shortest_first"``, sampling defaults, context tuning and model loading options
    (``n_threads`` defaults to the physical core count).

    Per request, ``adapters`` runs it under a LoRA adapter set (see
    :func:`~llamapy.server.adapters.resolve_adapters`): files are loaded once per server on the
    tick thread; requests of different sets never share a decode call or reuse each other's KV.

    Use as a context manager or call :meth:`close`: in-flight requests then end with
    :class:`~llamapy.errors.ClosedError`, the thread joins and the context is freed. The model
    is reference-counted: one obtained from :meth:`fetch_model` stays usable (tokenize,
    metadata) after ``close`` until its last holder drops it.

    Every generation method that starts from token ids also takes a
    :class:`~llamapy.server.GenerationIntent` in place of keyword options: :meth:`resolve`
    validates keywords once into that frozen value (the HTTP layer's resolver builds one per
    request), and :meth:`revise` changes it, checking again.

    Every generation call takes ``request_id`` (any hashable; default: a fresh id) so another
    thread or task can :meth:`cancel` it (its caller then gets
    :class:`~llamapy.errors.RequestCancelledError`); streams carry their ``request_id``.
    ``timeout`` bounds a whole call (:meth:`complete`, :meth:`generate` and their ``a*``
    twins: default 60 s, the wait for a model still loading included) or each chunk of a
    stream (default 30 s). Streams (:meth:`stream`, :meth:`events`, :meth:`astream`, ...) are
    objects validated at the call and submitted at their first iteration;
    :meth:`open_stream` / ``open_astream`` submit at once.

    A model served to pool its input (a reranker, ``pooling_type="rank"``) generates nothing:
    :meth:`score_tokens` / :meth:`ascore_tokens` score its inputs through the same engine
    (see :mod:`llamapy.server.pooled`).
    """

    def __init__(self, model_path: str | os.PathLike[str], **options: Any) -> None:
        self._open(load_server, model_path, options)

    @classmethod
    def hosting(cls, build: Callable[[ResolvedStart], Hosted],
                model_path: str | os.PathLike[str], **options: Any) -> Server:
        """A server whose tick thread hosts what ``build(start options)`` returns instead of
        loading ``model_path`` with libllama (the fake backend:
        :func:`llamapy.server.fake.fake_server`). ``options`` are validated as for
        ``Server(model_path, **options)``; a ``build`` that raises fails the load."""
        server = cls.__new__(cls)
        server._open(build, model_path, options)
        return server

    # --- blocking calls -----------------------------------------------------------------------

    def open_stream(self, token_ids: Sequence[int], intent: GenerationIntent | None = None, *,
                    per_event: bool = True, **options: Unpack[GenerationOptions]
                    ) -> RequestStream:
        """Low-level: submit a request **now** and return its event stream (token events, then
        the final ``DoneEvent``; errors raise from the stream). Unlike :meth:`events` it does
        not wait for a model still loading (the request queues behind the load); the HTTP
        layer uses it.

        The request is ``intent`` (from :meth:`resolve`) or the keyword ``options``, not both.
        Raises at once for unknown or invalid options and for a missing ``adapters`` file
        (``ModelLoadError``). ``timeout`` bounds each event (``per_event``) or the whole call.
        """
        call = self._prepare(intent, options, per_event=per_event)
        return RequestStream(self._loop, call.request(token_ids), call.timeout,
                             per_event=per_event, deadline=call.deadline)

    def complete_tokens(self, token_ids: Sequence[int],
                        intent: GenerationIntent | None = None,
                        **options: Unpack[GenerationOptions]) -> Completion:
        """Generate from tokens; return the text with completion metadata.

        ``timeout`` (default 60 s; None: no bound) is one deadline from the call, covering the
        wait for a model still loading and the generation; past it the request is cancelled
        and :class:`~llamapy.errors.RequestTimeoutError` (a ``TimeoutError``) raised. A load
        that fails meanwhile raises :class:`~llamapy.errors.LoadFailedError`.
        """
        call = self._prepare(intent, options, per_event=False)
        ids = prompt_ids(token_ids)
        self._wait_loaded(call.left(), call.timeout)
        return self._collect(call, ids)

    def complete(self, prompt: str, **options: Unpack[GenerationOptions]) -> Completion:
        """Like :meth:`complete_tokens`, from text (tokenizing within the same deadline)."""
        call = self._prepare(None, options, per_event=False)
        self._wait_loaded(call.left(), call.timeout)
        return self._collect(call, self.fetch_model().tokenize(prompt, True, True))

    def generate_tokens(self, token_ids: Sequence[int],
                        **options: Unpack[GenerationOptions]) -> str:
        """Generate text from tokens (blocking; see :meth:`complete_tokens`)."""
        return self.complete_tokens(token_ids, **options).text

    def generate(self, prompt: str, **options: Unpack[GenerationOptions]) -> str:
        """Generate text from a prompt (blocking; see :meth:`complete_tokens`). Options: see
        ``call_option_keys()``; OpenAI spellings (``temperature``, ``max_tokens``) and the
        option tree's (``temp``) are both accepted, one of them per option."""
        return self.complete(prompt, **options).text

    def _collect(self, call: Call, token_ids: Sequence[int]) -> Completion:
        collector = Collector(len(token_ids))
        with RequestStream(self._loop, call.request(token_ids), call.timeout,
                           per_event=False, deadline=call.deadline) as events:
            for event in events:
                done = collector.add(event)
                if done is not None:
                    return done
        raise AssertionError("request ended without a final event")

    # --- streams (submitted at the first iteration) -------------------------------------------

    def events(self, token_ids: Sequence[int], intent: GenerationIntent | None = None,
               **options: Unpack[GenerationOptions]) -> EventStream:
        """The raw engine events (tokens with logprobs, then the final event) as an
        :class:`~llamapy.runtime.EventStream`: options are validated now, the request is
        submitted at the first iteration or on entering ``with`` (see :meth:`stream_tokens`).
        """
        call = self._prepare(intent, options, per_event=True)
        ids = prompt_ids(token_ids)
        return self._event_stream(call, lambda: ids)

    def stream_tokens(self, token_ids: Sequence[int],
                      **options: Unpack[GenerationOptions]) -> TextChunks:
        """An iterator over text chunks as they are generated (a
        :class:`~llamapy.runtime.TextChunks`; use it in ``with`` to cancel on leaving).

        Unknown or invalid options raise here; the request is **submitted at the first
        iteration** (or ``with`` entry), so a stream never iterated holds no slot, and one
        cancelled before (``chunks.cancel()``, ``server.cancel(chunks.request_id)``) is never
        submitted. ``timeout`` (default 30 s) is per chunk and also bounds the first wait for a
        model still loading. Errors (queue full, failure, timeout) raise from the iterator;
        closing it early (or dropping it) cancels the request.
        """
        return TextChunks(self.events(token_ids, **options))

    def stream(self, prompt: str, **options: Unpack[GenerationOptions]) -> TextChunks:
        """Like :meth:`stream_tokens`, from text (tokenized at the first iteration)."""
        call = self._prepare(None, options, per_event=True)
        return TextChunks(self._event_stream(
            call, lambda: self.fetch_model().tokenize(prompt, True, True)))

    def _event_stream(self, call: Call, tokens: Callable[[], Sequence[int]]) -> EventStream:
        def prepare() -> Callable[[], RequestStream]:
            self._wait_loaded(call.timeout, call.timeout)
            request = call.request(tokens())
            return lambda: RequestStream(self._loop, request, call.timeout)
        return EventStream(call.request_id, prepare, self._pending)

    def __repr__(self) -> str:
        return f"<Server {os.path.basename(self.model_path)} {self._loop.state.value}>"
