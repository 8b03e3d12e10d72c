"""Each tenant's own counters (:mod:`llamapy.engine.tenant_counts`): what a view shown to one
tenant counts instead of the server's totals."""

from __future__ import annotations

import pytest
from engine_helpers import make_engine, submit

from llamapy.engine.tenant_counts import TenantCounts
from llamapy.engine.testing import drain
from llamapy.errors import TenantBusyError

SHORT = list(range(1, 9))
LONG = list(range(1, 158))  # another tenant's 157-token prompt


def tenant_stats(engine) -> dict:
    """The flat counters of each tenant in the engine's stats."""
    return {row.pop("tenant"): row for row in engine.stats().as_dict()["tenants"]}


def test_each_tenant_counts_its_own_requests_alone():
    engine, _ = make_engine(n_parallel=2)
    submit(engine, "b0", LONG, max_tokens=3, tenant="beta")
    submit(engine, "a0", SHORT, max_tokens=2, tenant="acme")
    submit(engine, "d0", SHORT, max_tokens=1)
    drain(engine, each=engine.check_integrity)
    counts = tenant_stats(engine)
    assert set(counts) == {"beta", "acme", None}
    acme, beta = counts["acme"], counts["beta"]
    assert (acme["num_submitted"], acme["num_finished"], acme["num_prompt_tokens"],
            acme["num_generated_tokens"]) == (1, 1, 8, 2)
    assert (beta["num_prompt_tokens"], beta["num_generated_tokens"]) == (157, 3)
    assert beta["num_prefill_tokens"] + sum(beta[f"num_reused_{s}"] for s in
                                            ("own", "donor", "ram", "disk", "inflight")) == 157
    totals = engine.stats().as_dict()
    for name in ("num_submitted", "num_finished", "num_prompt_tokens", "num_prefill_tokens",
                 "num_generated_tokens", "num_reused_ram"):
        assert sum(c[name] for c in counts.values()) == totals[name], name


def test_reuse_and_time_to_first_token_are_the_tenants_own():
    engine, _ = make_engine(n_parallel=1, prompt_cache_ram_mb=64)
    for rid in ("a0", "a1"):
        submit(engine, rid, LONG, max_tokens=2, tenant="acme")
        drain(engine)
    submit(engine, "b0", LONG, max_tokens=2, tenant="beta")
    drain(engine, each=engine.check_integrity)
    counts = tenant_stats(engine)
    reused = {t: sum(c[f"num_reused_{s}"] for s in ("own", "donor", "ram", "disk", "inflight"))
              for t, c in counts.items()}
    assert reused["acme"] > 0 and reused["beta"] == 0  # KV never crosses tenants
    assert counts["acme"]["ttft_count"] == 2 and counts["beta"]["ttft_count"] == 1


def test_running_and_queued_requests_count_as_they_go():
    engine, _ = make_engine(n_parallel=1)
    submit(engine, "b0", LONG, max_tokens=50, tenant="beta")
    submit(engine, "b1", SHORT, max_tokens=5, tenant="beta")
    for _ in range(5):
        engine.tick()
    beta = tenant_stats(engine)["beta"]
    assert beta["num_queued"] == 1 and beta["num_finished"] == 0
    assert beta["num_prefill_tokens"] > 0  # b0's prompt as it is computed
    assert "acme" not in tenant_stats(engine)
    drain(engine, each=engine.check_integrity)
    beta = tenant_stats(engine)["beta"]
    assert (beta["num_queued"], beta["num_finished"]) == (0, 2)
    assert beta["num_generated_tokens"] == engine.counters.num_generated_tokens > 0


def test_a_refusal_counts_for_the_refused_tenant():
    engine, _ = make_engine(n_parallel=1, max_queue=0, tenant_max_requests=1)
    submit(engine, "b0", SHORT, max_tokens=2, tenant="beta")
    with pytest.raises(TenantBusyError):
        submit(engine, "b1", SHORT, max_tokens=2, tenant="beta")
    submit(engine, "a0", SHORT, max_tokens=2, tenant="acme")
    drain(engine, each=engine.check_integrity)
    counts = tenant_stats(engine)
    assert (counts["beta"]["num_rejected"], counts["acme"]["num_rejected"]) == (1, 0)
    assert engine.counters.num_rejected == 1


def test_the_tenants_remembered_are_bounded():
    counts = TenantCounts(max_tenants=2)
    for tenant in ("a", "b", "c"):
        counts.rejected(tenant)
    assert set(counts.snapshot(())) == {"b", "c"}
