"""Options of a Ray Serve deployment of llamapy (:mod:`llamapy.ray`): replicas, the router and
its affinity policy, the routing key's prefix blocks. Pure Python, like the rest of the tree;
``serve run llamapy.ray:app key=value ...`` accepts these names besides the server's flags."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llamapy.errors import InvalidOptionError, UnknownOptionError
from llamapy.options._spec import check, check_typed_fields, is_num, option, option_names

__all__ = ["DEPLOYMENT_DEFAULTS", "ROUTERS", "DeploymentOptions", "deployment_option_keys"]

#: The request routers a deployment can use: llamapy's affinity router or Ray's default
#: (power of two choices, affinity-blind).
ROUTERS = ("affinity", "default")


@dataclass(frozen=True, slots=True, kw_only=True)
class DeploymentOptions:
    """How :func:`llamapy.ray.build_app` deploys a model."""

    replicas: int = option(2, "model replicas (each runs one Server)")
    router: str = option("affinity", "request router: affinity or default (Ray's, load only)")
    max_imbalance: int = option(
        4, "affinity yields to load when the holder's load exceeds the least loaded's by more")
    max_entries: int = option(8192, "LRU bound of the router's session and prefix maps (each)")
    block_chars: int = option(128, "characters per hashed prefix block of the routing key")
    max_blocks: int = option(64, "most prefix blocks hashed per request")
    stats_period_s: float = option(1.0, "seconds between a replica's routing stats reports")
    replica_cpus: float = option(1.0, "CPUs Ray reserves per model replica")
    max_ongoing_requests: int = option(16, "requests Ray sends one replica at a time")

    def __post_init__(self) -> None:
        check_typed_fields(self)
        check(self.router in ROUTERS, "router", f"must be one of {ROUTERS}, got {self.router!r}")
        for name in ("replicas", "block_chars", "max_blocks", "max_entries",
                     "max_ongoing_requests"):
            check(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        check(self.max_imbalance >= 0, "max_imbalance", "must be >= 0")
        check(self.stats_period_s > 0, "stats_period_s", "must be > 0")
        check(is_num(self.replica_cpus) and self.replica_cpus >= 0, "replica_cpus", "must be >= 0")

    @classmethod
    def from_strings(cls, values: Mapping[str, str]) -> DeploymentOptions:
        """The options from ``key=value`` strings (``serve run`` arguments), by field type."""
        unknown = set(values) - set(deployment_option_keys())
        if unknown:
            raise UnknownOptionError(unknown, deployment_option_keys(), where="deployment")
        kinds = {f.name: f.type for f in dataclasses.fields(cls)}
        return cls(**{name: _parse(kinds[name], name, text) for name, text in values.items()})


def _parse(kind: Any, name: str, text: str) -> Any:
    convert = {"int": int, "float": float}.get(str(kind), str)
    try:
        return convert(text)
    except ValueError:
        raise InvalidOptionError(f"{name}: expected {kind}, got {text!r}", option=name) from None


def deployment_option_keys() -> tuple[str, ...]:
    """Every deployment option name."""
    return option_names(DeploymentOptions)


#: The defaults the router, the key and the builder read.
DEPLOYMENT_DEFAULTS = DeploymentOptions()
