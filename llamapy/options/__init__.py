"""One option tree: every option name of llamapy, defined once, with one default and a help text.

Pure Python (it imports only the standard library and :mod:`llamapy.errors`), so every layer can
use it: the engine re-exports its part (:mod:`llamapy.engine.options`), ``_native`` maps
:class:`ModelOptions` / :class:`ContextOptions` to libllama's params, the server composes its
start options from it (:mod:`llamapy.options.start`), the CLI generates its flags from it and the
HTTP layer renames foreign spellings through :data:`ALIASES`.

- :mod:`~llamapy.options.sampling`: :class:`SamplingParams`, :class:`RequestOptions`;
- :mod:`~llamapy.options.engine`: :class:`EngineConfig`, :class:`EngineTuning`;
- :mod:`~llamapy.options.context`: :class:`ContextOptions` and the shared sizing defaults;
- :mod:`~llamapy.options.model`: :class:`ModelOptions`;
- :mod:`~llamapy.options.deployment`: :class:`DeploymentOptions` (a Ray Serve deployment);
- :mod:`~llamapy.options.hub`: :class:`HubOptions` (a model named on the Hugging Face Hub);
- :mod:`~llamapy.options.serve`: :class:`ServeOptions` (how the HTTP server presents its models
  and treats requests);
- :mod:`~llamapy.options.timeouts`: :class:`Timeouts` (:data:`TIMEOUTS`);
- :mod:`~llamapy.options.aliases`: :data:`ALIASES`, :data:`REASONING_FORMATS`;
- :mod:`~llamapy.options.start`: :class:`ServerOptions`, :class:`CallOptions`,
  :func:`resolve_start_options`;
- :mod:`~llamapy.options.typed`: :class:`GenerationOptions`, the keyword ``TypedDict`` of a
  generation call (generated from this tree by ``python -m llamapy.options._typed_gen``).
"""

from llamapy.options._spec import field_default, field_help, option, option_factory, option_names
from llamapy.options.aliases import (
    ALIASES,
    REASONING_FORMATS,
    aliases_of,
    canonical_name,
    check_reasoning_format,
)
from llamapy.options.context import (
    KV_UNIFIED,
    N_BATCH_MAX,
    N_CTX,
    N_PARALLEL,
    SERVER_OWNED_KEYS,
    ContextOptions,
    context_option_keys,
    default_n_batch,
    tuning_option_keys,
)
from llamapy.options.deployment import DEPLOYMENT_DEFAULTS, DeploymentOptions
from llamapy.options.engine import (
    EngineConfig,
    EngineTuning,
    engine_option_keys,
    make_engine_config,
)
from llamapy.options.hub import HubOptions, ModelRef, parse_model_ref
from llamapy.options.model import MODEL_ONLY_KEYS, ModelOptions, load_option_keys
from llamapy.options.sampling import (
    LLAMA_DEFAULT_SEED,
    RequestOptions,
    SamplingParams,
    request_option_keys,
    resolve_request_options,
    sampling_option_keys,
)
from llamapy.options.serve import SERVE_OPTION_NAMES, ServeOptions
from llamapy.options.start import (
    CALL_OPTION_KEYS,
    START_OPTION_OWNERS,
    CallOptions,
    ResolvedStart,
    ServerOptions,
    call_option_keys,
    resolve_start_options,
    server_request_option_keys,
    start_option_keys,
)
from llamapy.options.timeouts import TIMEOUTS, Timeouts
from llamapy.options.typed import GenerationOptions

__all__ = [
    "ALIASES",
    "CALL_OPTION_KEYS",
    "DEPLOYMENT_DEFAULTS",
    "KV_UNIFIED",
    "LLAMA_DEFAULT_SEED",
    "MODEL_ONLY_KEYS",
    "N_BATCH_MAX",
    "N_CTX",
    "N_PARALLEL",
    "REASONING_FORMATS",
    "SERVER_OWNED_KEYS",
    "SERVE_OPTION_NAMES",
    "START_OPTION_OWNERS",
    "TIMEOUTS",
    "CallOptions",
    "ContextOptions",
    "DeploymentOptions",
    "EngineConfig",
    "EngineTuning",
    "GenerationOptions",
    "HubOptions",
    "ModelOptions",
    "ModelRef",
    "RequestOptions",
    "ResolvedStart",
    "SamplingParams",
    "ServeOptions",
    "ServerOptions",
    "Timeouts",
    "aliases_of",
    "call_option_keys",
    "canonical_name",
    "check_reasoning_format",
    "context_option_keys",
    "default_n_batch",
    "engine_option_keys",
    "field_default",
    "field_help",
    "load_option_keys",
    "make_engine_config",
    "option",
    "option_factory",
    "option_names",
    "parse_model_ref",
    "request_option_keys",
    "resolve_request_options",
    "resolve_start_options",
    "sampling_option_keys",
    "server_request_option_keys",
    "start_option_keys",
    "tuning_option_keys",
]
