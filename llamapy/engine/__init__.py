"""The pure-Python serving core: slots, continuous batching, prefix reuse.

Never imports cffi or ``llamapy._native``: it drives any :class:`Backend`.
"""

from llamapy.engine.backend import Backend, BatchPlan, Sampler, Segment
from llamapy.engine.engine import Engine
from llamapy.engine.fake.backend import FakeBackend, FakeSampler
from llamapy.engine.fake.model import CostModel, FakeModel, SimClock, reference
from llamapy.engine.options import (
    LLAMA_DEFAULT_SEED,
    EngineConfig,
    EngineTuning,
    RequestOptions,
    SamplingParams,
    engine_option_keys,
    make_engine_config,
    request_option_keys,
    resolve_request_options,
    sampling_option_keys,
)
from llamapy.engine.request import (
    DoneEvent,
    ErrorEvent,
    Event,
    FinishReason,
    ProgressEvent,
    Request,
    RequestTimings,
    Sink,
    StreamEvent,
    TokenEvent,
)
from llamapy.engine.stats import Counters, EngineStats, InstabilityEvent
from llamapy.engine.strategies import (
    Balanced,
    BaseStrategy,
    BatchDecision,
    BatchStrategy,
    BatchView,
    DecodeMaximal,
    PrefillPriority,
    QueuedView,
    ShortestFirst,
    SlotView,
    resolve_strategy,
)

__all__ = [
    "LLAMA_DEFAULT_SEED",
    "Backend",
    "Balanced",
    "BaseStrategy",
    "BatchDecision",
    "BatchPlan",
    "BatchStrategy",
    "BatchView",
    "CostModel",
    "Counters",
    "DecodeMaximal",
    "DoneEvent",
    "Engine",
    "EngineConfig",
    "EngineStats",
    "EngineTuning",
    "ErrorEvent",
    "Event",
    "FakeBackend",
    "FakeModel",
    "FakeSampler",
    "FinishReason",
    "InstabilityEvent",
    "PrefillPriority",
    "ProgressEvent",
    "QueuedView",
    "Request",
    "RequestOptions",
    "RequestTimings",
    "Sampler",
    "SamplingParams",
    "Segment",
    "ShortestFirst",
    "SimClock",
    "Sink",
    "SlotView",
    "StreamEvent",
    "TokenEvent",
    "engine_option_keys",
    "make_engine_config",
    "reference",
    "request_option_keys",
    "resolve_request_options",
    "resolve_strategy",
    "sampling_option_keys",
]
