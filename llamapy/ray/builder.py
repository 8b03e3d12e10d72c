"""Build the Ray Serve application: an ingress deployment in front of N model replicas.

``serve run llamapy.ray:app model=PATH replicas=2 n_ctx=8192 ...`` calls :func:`app` with the
``key=value`` arguments: the :class:`~llamapy.options.DeploymentOptions` names, and any flag of
``python -m llamapy.serve`` written without its dashes (``n_parallel=4``, ``api_key=KEY``,
``metrics=false``); from Python, :func:`build_app` takes the same options as keywords.
``api_key_file=FILE`` (lines ``KEY [TENANT [admin]]``) is read once, here: the replicas check
the keys and run each request in its key's tenant, and the ingress scopes its routing key by
that tenant (:mod:`llamapy.ray.tenancy`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.deployment import Application

from ..errors import InvalidOptionError, UnknownOptionError
from ..options.deployment import DeploymentOptions, deployment_option_keys
from ..server import start_option_keys
from .ingress import MAX_BODY_BYTES, LlamapyIngress
from .replica import LlamapyReplica
from .router import AffinityRouter
from .tenancy import tenant_lookup

#: The deployments' names in the Serve application.
MODEL_DEPLOYMENT = "llamapy-model"
INGRESS_DEPLOYMENT = "llamapy-ingress"


def build_app(model: str | os.PathLike[str], *, app_options: Mapping[str, Any] | None = None,
              deployment: DeploymentOptions | None = None, **start_options: Any) -> Application:
    """The application serving ``model`` with ``deployment`` options (default
    :data:`~llamapy.options.DEPLOYMENT_DEFAULTS`: 2 replicas, the affinity router).

    ``start_options`` are ``Server`` start options, the same for every replica (unknown names
    raise :class:`~llamapy.errors.UnknownOptionError` here, not in the replicas; the defaults
    are the ``Server``'s, so no RAM prompt cache unless ``prompt_cache_ram_mb`` is given:
    :func:`app` applies ``python -m llamapy.serve``'s);
    ``app_options`` are :func:`~llamapy.serve.create_app` keywords (``allowed_hosts``
    defaults to any Host: Ray's proxy, configured by the operator, is what is exposed; their
    ``api_keys`` table also tells the ingress each request's tenant,
    :mod:`llamapy.ray.tenancy`). Run it with ``serve.run(build_app(...))``.
    """
    options = deployment or DeploymentOptions()
    unknown = set(start_options) - set(start_option_keys())
    if unknown:
        raise UnknownOptionError(unknown, start_option_keys(), where="start")
    app_kw = dict(app_options or {})
    if not app_kw.get("allowed_hosts"):  # Ray's proxy, not the replica, decides the exposure
        app_kw["allowed_hosts"] = ("*",)
    replica = serve.deployment(
        name=MODEL_DEPLOYMENT, num_replicas=options.replicas,
        max_ongoing_requests=options.max_ongoing_requests,
        ray_actor_options={"num_cpus": options.replica_cpus},
        request_router_config=_router_config(options))(LlamapyReplica)
    ingress = serve.deployment(name=INGRESS_DEPLOYMENT, ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=1024)(LlamapyIngress)
    return ingress.bind(
        replica.bind(os.fspath(model), start_options, app_kw),
        max_body_bytes=app_kw.get("max_body_bytes", MAX_BODY_BYTES),
        block_chars=options.block_chars, max_blocks=options.max_blocks,
        tenant_of=tenant_lookup(app_kw))


def _router_config(options: DeploymentOptions) -> RequestRouterConfig:
    """The model deployment's router: llamapy's affinity router or Ray's default."""
    config: dict[str, Any] = {  # Any: Ray annotates the keywords as dicts
        "request_routing_stats_period_s": options.stats_period_s,
        "request_routing_stats_timeout_s": max(options.stats_period_s * 5, 5.0)}
    if options.router == "affinity":
        config.update(request_router_class=AffinityRouter, request_router_kwargs={
            "max_imbalance": options.max_imbalance, "max_entries": options.max_entries})
    return RequestRouterConfig(**config)


def app(args: Mapping[str, str]) -> Application:
    """``serve run llamapy.ray:app model=PATH replicas=N ...``: the deployment options by
    name, every other argument a ``python -m llamapy.serve`` flag (``true`` / ``false`` for
    switches). Several models (``models_dir=`` ...) are refused: one model per application."""
    ours = {k: v for k, v in args.items() if k in deployment_option_keys()}
    flags = _parse_flags({k: v for k, v in args.items() if k not in ours})
    from ..serve.cli import model_path
    from ..serve.flags.compat import check_compat
    from ..serve.flags.models import serves_several
    from ..serve.flags.serving import app_options
    from ..serve.flags.start import serve_start_options

    if serves_several(flags):
        raise InvalidOptionError("llamapy.ray serves one model per application", option="model")
    check_compat(flags)  # what cannot be honoured (cont_batching=false) fails here too
    return build_app(model_path(flags.model[0] if flags.model else None),
                     app_options=app_options(flags),
                     deployment=DeploymentOptions.from_strings(ours),
                     **serve_start_options(flags))


def _parse_flags(args: Mapping[str, str]) -> Any:
    """The ``llamapy.serve`` command line of ``key=value`` arguments, parsed."""
    from ..serve.cli import build_parser

    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value.lower() == "true":
            argv.append(flag)
        elif value.lower() == "false":
            argv.append("--no-" + key.replace("_", "-"))
        else:
            argv += [flag, value]
    return build_parser().parse_args(argv)
