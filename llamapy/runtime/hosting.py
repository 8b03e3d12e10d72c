"""What a tick thread hosts (:class:`Hosted`) and the states it goes through
(:class:`LoopState`)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from llamapy.engine.engine import Engine
from llamapy.runtime.model_info import MediaEncoding, ModelInfo

__all__ = ["Hosted", "LoopState"]


class LoopState(enum.Enum):
    """Lifecycle of the tick thread."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    CLOSED = "closed"
    CRASHED = "crashed"


@dataclass(slots=True)
class Hosted:
    """What a tick thread hosts: the engine, the model callers may hold (or None), the
    model's media encoder (a :class:`~llamapy.media.encoder.MediaEncoder` or the fake one; None
    without a projector), and how to free the native resources after the engine closed
    (context first; the model is only dropped, so a caller still holding it keeps it alive)."""

    engine: Engine
    model: ModelInfo | None = None
    media: MediaEncoding | None = None
    free: Callable[[], None] = field(default=lambda: None)
    #: A count that advances while the model computes (None: not known); a tick whose count
    #: moves is working, however long it runs (see :mod:`llamapy.runtime.stall`).
    progress: Callable[[], int] | None = None
