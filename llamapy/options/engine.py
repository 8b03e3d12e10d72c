"""The engine's scheduling options and heuristics.

``EngineConfig`` holds the server-level scheduling options (and the server's sampling
defaults); :func:`make_engine_config` builds it from flat keys, raising
:class:`~llamapy.errors.UnknownOptionError` for unknown ones. ``EngineTuning`` holds heuristics
that are not server options.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llamapy.options._spec import check, is_int, is_num, option, option_factory, option_names
from llamapy.options.context import KV_UNIFIED, N_CTX, N_PARALLEL, default_n_batch
from llamapy.options.limits import RequestLimits
from llamapy.options.sampling import SamplingParams, sampling_option_keys, split_sampling
from llamapy.options.speculative import SpeculativeParams, parse_spec_type

__all__ = ["EngineConfig", "EngineTuning", "engine_option_keys", "make_engine_config"]


@dataclass(slots=True, frozen=True, kw_only=True)
class EngineConfig(RequestLimits):
    """Server-level scheduling options (``n_ctx``/``n_batch`` limits come from the backend).

    ``n_batch`` is capped by the backend's ``n_batch``; ``chunk_size`` bounds prefill tokens per
    slot per tick; ``max_queue`` bounds requests waiting for a slot (0 = unlimited).
    ``tenant_max_requests`` bounds one tenant's queued plus running requests (0 = no bound),
    ``tenant_max_slots`` the slots its requests hold at once (0 = every slot) and
    ``tenant_cache_share`` the share of each prompt cache one tenant may hold (see
    :mod:`llamapy.engine.tenants`).
    ``kv_unified`` must match the backend's. ``prompt_cache_ram_mb`` is the level-2 RAM prompt
    cache budget (0 = off); ``prompt_cache_dir`` and ``prompt_cache_disk_mb`` the level-3 disk
    prompt cache's folder (None = off) and budget (see :mod:`llamapy.engine.cache.disk`).
    ``batch_strategy`` is a strategy name (``"shortest_first"``, the default,
    ``"decode_maximal"``, ``"prefill_priority"``, ``"balanced"``), class or instance (see
    :mod:`llamapy.engine.strategies`). ``slot_prompt_similarity`` and ``cache_idle_slots``
    are llama-server's options of those names: the share of a prompt a free slot's cached
    prefix must match to be chosen, and parking idle slots in the RAM cache (see
    :meth:`~llamapy.engine.cache.resolver.PrefixResolver.park_idle`). ``sampling`` holds the
    server's sampling defaults. The ``max_*`` fields are the serving limits on one request
    (:class:`~llamapy.options.limits.RequestLimits`).
    The ``spec_*`` fields are the server's speculative decoding defaults (llama-server's flag
    names; see :mod:`llamapy.options.speculative`), :attr:`speculative` their resolved form.
    """

    n_parallel: int = option(N_PARALLEL, "slots: requests decoded concurrently")
    n_batch: int = option(default_n_batch(N_CTX), "most tokens per decode call")
    chunk_size: int = option(512, "most prefill tokens per slot per tick")
    max_queue: int = option(64, "most requests waiting for a slot (0 = unlimited)")
    tenant_max_requests: int = option(
        0, "most queued plus running requests one tenant may hold; one more is refused with "
        "429 (0 = no per-tenant bound)")
    tenant_max_slots: int = option(
        0, "most slots one tenant's requests hold at once; the others stay free for other "
        "tenants' arrivals (0 = every slot)")
    tenant_cache_share: float = option(
        1.0, "most of each prompt cache's budget (RAM and disk) one tenant may hold, as a "
        "share in (0, 1]; a tenant at its share evicts its own entries (1 = no per-tenant "
        "bound)")
    cache_prompt: bool = option(True, "reuse cached prompt prefixes (requests may opt out)")
    kv_unified: bool = option(KV_UNIFIED, "one KV cell pool shared by all slots",
                              flags=("-kvu", "-no-kvu"))
    prompt_cache_ram_mb: float = option(0, "RAM prompt cache budget in MB (0 = off)",
                                        flags=("-cram", "--cache-ram"))
    prompt_cache_dir: str | None = option(
        None, "folder of the disk prompt cache, below the RAM cache; kept across restarts and "
        "shareable by servers (default: off)")
    prompt_cache_disk_mb: float = option(8192, "disk prompt cache budget in MB (with "
                                         "--prompt-cache-dir; 0 = off)")
    ctx_checkpoints: int = option(
        32, "most context checkpoints a slot keeps on a model whose state cannot be trimmed "
        "(recurrent, hybrid): restore points a new prompt that diverges inside the cached one "
        "resumes from (0 = off)", flags=("-ctxcp", "--swa-checkpoints"))
    ctx_checkpoints_mb: float = option(
        512, "most MB of context checkpoints a slot keeps")
    checkpoint_min_step: int = option(
        512, "prompt tokens between the checkpoints taken during a prefill (besides the end "
        "of the prompt and the start of the generation prompt; 0 = only those)",
        flags=("-cms",))
    batch_strategy: Any = option(
        "shortest_first", "batch strategy: shortest_first (time to first token), "
        "decode_maximal, prefill_priority or balanced")
    slot_prompt_similarity: float = option(
        0.1, "share of a prompt a free slot's cached prefix must match for the request to "
        "take that slot (0 = off: the least recently used slot)", flags=("-sps",))
    cache_idle_slots: bool = option(
        True, "while other slots decode, move an idle slot's prefix to the RAM cache and free "
        "its cells (unified KV with the RAM cache on)")
    spec_type: str = option("off", "speculative drafters, comma-separated: ngram (ngram-mod, "
                            "ngram-simple, ...), draft (draft-simple) or off")
    spec_draft_n_max: int = option(16, "most draft tokens verified per step",
                                   flags=("--draft-max", "--draft"))
    spec_draft_n_min: int = option(0, "fewest draft tokens worth verifying",
                                   flags=("--draft-min",))
    spec_draft_p_min: float = option(0.0, "draft model: stop drafting below this probability",
                                     flags=("--draft-p-min",))
    spec_ngram_size: int = option(4, "longest n-gram the prompt lookup matches")
    spec_adaptive: bool = option(True, "adapt draft length to acceptance, off below break-even")
    spec_max_streams: int = option(1, "draft only while at most this many requests decode (0 = "
                                      "any number; on a CPU drafts pay only for few streams)")
    sampling: SamplingParams = option_factory(SamplingParams, "the server's sampling defaults")

    def __post_init__(self) -> None:
        RequestLimits.__post_init__(self)
        for name in ("n_parallel", "n_batch", "chunk_size"):
            value = getattr(self, name)
            check(is_int(value) and value >= 1, name, f"must be an integer >= 1, got {value!r}")
        check(is_int(self.max_queue) and self.max_queue >= 0, "max_queue",
              "must be an integer >= 0 (0 = unlimited)")
        check(is_int(self.tenant_max_requests) and self.tenant_max_requests >= 0,
              "tenant_max_requests", "must be an integer >= 0 (0 = no per-tenant bound)")
        check(is_int(self.tenant_max_slots) and self.tenant_max_slots >= 0, "tenant_max_slots",
              "must be an integer >= 0 (0 = every slot)")
        check(is_num(self.tenant_cache_share) and 0 < self.tenant_cache_share <= 1,
              "tenant_cache_share", "must be a number in (0, 1]")
        check(isinstance(self.cache_prompt, bool), "cache_prompt", "must be a bool")
        check(isinstance(self.kv_unified, bool), "kv_unified", "must be a bool")
        check(isinstance(self.cache_idle_slots, bool), "cache_idle_slots", "must be a bool")
        check(is_num(self.slot_prompt_similarity) and 0 <= self.slot_prompt_similarity <= 1,
              "slot_prompt_similarity", "must be a number in [0, 1]")
        check(is_num(self.prompt_cache_ram_mb) and self.prompt_cache_ram_mb >= 0,
              "prompt_cache_ram_mb", "must be a number >= 0")
        if isinstance(self.prompt_cache_dir, os.PathLike):  # a Path is welcome, stored as str
            object.__setattr__(self, "prompt_cache_dir", os.fspath(self.prompt_cache_dir))
        check(self.prompt_cache_dir is None or (isinstance(self.prompt_cache_dir, str)
                                                and self.prompt_cache_dir != ""),
              "prompt_cache_dir", "must be a folder path or None")
        check(is_num(self.prompt_cache_disk_mb) and self.prompt_cache_disk_mb >= 0,
              "prompt_cache_disk_mb", "must be a number >= 0")
        for name in ("ctx_checkpoints", "checkpoint_min_step"):
            value = getattr(self, name)
            check(is_int(value) and value >= 0, name, f"must be an integer >= 0, got {value!r}")
        check(is_num(self.ctx_checkpoints_mb) and self.ctx_checkpoints_mb >= 0,
              "ctx_checkpoints_mb", "must be a number >= 0")
        # The strategy registry belongs to the engine; this call-time import creates no import
        # cycle (the tree itself never imports the engine at module level).
        from llamapy.engine.strategies import resolve_strategy

        resolve_strategy(self.batch_strategy)  # validate at start, raise InvalidOptionError
        self.speculative  # validate the spec_* fields at start  # noqa: B018

    @property
    def speculative(self) -> SpeculativeParams:
        """The server's speculative decoding defaults, resolved (built on each call: keep it)."""
        return SpeculativeParams(
            type=parse_spec_type(self.spec_type), n_max=self.spec_draft_n_max,
            n_min=self.spec_draft_n_min, p_min=self.spec_draft_p_min,
            ngram_size=self.spec_ngram_size, adaptive=self.spec_adaptive,
            max_streams=self.spec_max_streams)

    @property
    def prompt_cache_ram_bytes(self) -> int:
        """The RAM prompt cache budget in bytes."""
        return int(self.prompt_cache_ram_mb * 1024 * 1024)

    @property
    def prompt_cache_disk_bytes(self) -> int:
        """The disk prompt cache budget in bytes (0 without a folder)."""
        if self.prompt_cache_dir is None:
            return 0
        return int(self.prompt_cache_disk_mb * 1024 * 1024)


def engine_option_keys() -> tuple[str, ...]:
    """Server-level option names: :class:`EngineConfig` fields plus the sampling defaults."""
    return option_names(EngineConfig, exclude=("sampling",)) + sampling_option_keys()


def make_engine_config(options: Mapping[str, Any]) -> EngineConfig:
    """Build :class:`EngineConfig` from flat server-level keys (sampling keys become the
    sampling defaults). Unknown keys raise ``UnknownOptionError``."""
    mine, sampling = split_sampling(options, option_names(EngineConfig, exclude=("sampling",)),
                                    "engine")
    return EngineConfig(**mine, sampling=SamplingParams(**sampling))


@dataclass(slots=True, frozen=True, kw_only=True)
class EngineTuning:
    """Engine heuristics (not server options; tests and simulations adjust them).

    ``ram_min_tokens`` / ``ram_min_fraction``: the RAM cache skips shorter prefixes and
    restores an entry only when this share of it is reusable; ``ram_pin_share`` bounds the
    entries requests pin (``cache_pins``) to this share of it. ``inflight_dedup``: requests whose
    prefix another slot is computing right now adopt it instead of recomputing it;
    ``follow_min_tokens`` is the least shared remainder worth waiting a tick for.
    ``instability_min_history``: histories shorter than this never raise prefix instability.
    ``disk_min_tokens`` / ``disk_min_fraction``: the same for the disk cache.
    ``disk_read_wait_s``: a run waits at most this long for a disk entry being read (off the
    tick thread) before it gives up on it. ``disk_flush_s``: at close, slot and RAM cache
    prefixes are written to disk for this long at most. ``disk_background``: False writes and
    reads the disk cache on the tick thread (deterministic tests).
    ``spec_prior_beta``: the marginal cost of a batch token relative to a one-token decode,
    assumed by adaptive speculation until the engine has measured it. ``steady_steps``: on
    an asynchronous device, how many steady decode steps one tick may chain, each planned while
    the one before computes (:mod:`llamapy.engine.steady`; 0: one step a tick).
    """

    ram_min_tokens: int = option(32, "shortest prefix the RAM cache keeps")
    ram_min_fraction: float = option(0.5, "reusable share needed to restore a RAM entry")
    ram_pin_share: float = option(0.5, "most of the RAM cache (and of each tenant's bound) "
                                  "that pinned entries may hold")
    inflight_dedup: bool = option(True, "adopt a prefix another slot is computing")
    follow_min_tokens: int = option(8, "least shared remainder worth waiting a tick for")
    instability_min_history: int = option(256, "shortest history that can be unstable")
    disk_min_tokens: int = option(32, "shortest prefix the disk cache keeps")
    disk_min_fraction: float = option(0.5, "reusable share needed to restore a disk entry")
    disk_read_wait_s: float = option(30.0, "longest wait for a disk entry being read")
    disk_flush_s: float = option(20.0, "longest time spent writing prefixes to disk at close")
    disk_background: bool = option(True, "write and read the disk cache off the tick thread")
    spec_prior_beta: float = option(0.3, "assumed cost of a batch token until it is measured")
    steady_steps: int = option(32, "decode steps a tick may chain on an asynchronous device "
                                   "while every running slot decodes and nothing else changes")
