"""llama-server's environment variables (``LLAMA_ARG_CTX_SIZE=8192``, ``LLAMA_API_KEY``,
...), read as the flags they stand for, so a container configured for llama-server runs
unchanged. A flag on the command line wins over its variable, as in llama-server.

A variable of a switch takes llama.cpp's words: ``1``/``true``/``on``/``enabled`` and
``0``/``false``/``off``/``disabled`` (a switch without an "off" flag ignores the "off" words).
Another value is an error naming the variable. A ``LLAMA_ARG_*`` variable of a flag this
server does not have is not read, and a warning names it (its flag is an error on the command
line).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence

from ...errors import InvalidOptionError

__all__ = ["LLAMA_ENV", "env_argv"]

log = logging.getLogger("llamapy.serve")

#: Variable -> the flag it stands for (llama-server's ``--help`` at the pinned commit, for
#: the flags this server has).
LLAMA_ENV: dict[str, str] = {
    "LLAMA_API_KEY": "--api-key",
    "LLAMA_ARG_ALIAS": "-a",
    "LLAMA_ARG_API_KEY_FILE": "--api-key-file",
    "LLAMA_ARG_API_PREFIX": "--api-prefix",
    "LLAMA_ARG_BATCH": "-b",
    "LLAMA_ARG_CACHE_IDLE_SLOTS": "--cache-idle-slots",
    "LLAMA_ARG_CACHE_PROMPT": "--cache-prompt",
    "LLAMA_ARG_CACHE_RAM": "--cache-ram",
    "LLAMA_ARG_CACHE_TYPE_K": "-ctk",
    "LLAMA_ARG_CACHE_TYPE_V": "-ctv",
    "LLAMA_ARG_CHAT_TEMPLATE": "--chat-template",
    "LLAMA_ARG_CHAT_TEMPLATE_FILE": "--chat-template-file",
    "LLAMA_ARG_CHAT_TEMPLATE_KWARGS": "--chat-template-kwargs",
    "LLAMA_ARG_CONT_BATCHING": "-cb",
    "LLAMA_ARG_CORS_ORIGINS": "--cors-origins",
    "LLAMA_ARG_CTX_SIZE": "-c",
    "LLAMA_ARG_DRAFT_MAX": "--draft",
    "LLAMA_ARG_DRAFT_MIN": "--draft-min",
    "LLAMA_ARG_EMBEDDINGS": "--embedding",
    "LLAMA_ARG_ENDPOINT_METRICS": "--metrics",
    "LLAMA_ARG_ENDPOINT_PROPS": "--props",
    "LLAMA_ARG_ENDPOINT_SLOTS": "--slots",
    "LLAMA_ARG_FLASH_ATTN": "-fa",
    "LLAMA_ARG_FREQUENCY_PENALTY": "--frequency-penalty",
    "LLAMA_ARG_HOST": "--host",
    "LLAMA_ARG_JINJA": "--jinja",
    "LLAMA_ARG_KV_UNIFIED": "-kvu",
    "LLAMA_ARG_LOAD_MODE": "-lm",
    "LLAMA_ARG_HF_FILE": "--hf-file",
    "LLAMA_ARG_HF_REPO": "--hf-repo",
    "LLAMA_ARG_LOG_COLORS": "--log-colors",
    "LLAMA_ARG_LOG_FILE": "--log-file",
    "LLAMA_ARG_LOG_PREFIX": "--log-prefix",
    "LLAMA_ARG_LOG_TIMESTAMPS": "--log-timestamps",
    "LLAMA_ARG_LOG_VERBOSITY": "-lv",
    "LLAMA_ARG_MAIN_GPU": "-mg",
    "LLAMA_ARG_MIN_P": "--min-p",
    "LLAMA_ARG_MEDIA_PATH": "--media-path",
    "LLAMA_ARG_MMPROJ": "--mmproj",
    "LLAMA_ARG_MMPROJ_OFFLOAD": "--mmproj-offload",
    "LLAMA_ARG_MODEL": "-m",
    "LLAMA_ARG_MODELS_DIR": "--models-dir",
    "LLAMA_ARG_MODELS_MAX": "--models-max",
    "LLAMA_ARG_MODELS_PRESET": "--models-preset",
    "LLAMA_ARG_N_GPU_LAYERS": "-ngl",
    "LLAMA_ARG_N_PARALLEL": "-np",
    "LLAMA_ARG_N_PREDICT": "-n",
    "LLAMA_ARG_OFFLINE": "--offline",
    "LLAMA_ARG_PERF": "--perf",
    "LLAMA_ARG_POOLING": "--pooling",
    "LLAMA_ARG_RERANKING": "--reranking",
    "LLAMA_ARG_PORT": "--port",
    "LLAMA_ARG_PREFILL_ASSISTANT": "--prefill-assistant",
    "LLAMA_ARG_PRESENCE_PENALTY": "--presence-penalty",
    "LLAMA_ARG_REASONING": "-rea",
    "LLAMA_ARG_REPEAT_PENALTY": "--repeat-penalty",
    "LLAMA_ARG_ROPE_FREQ_BASE": "--rope-freq-base",
    "LLAMA_ARG_ROPE_FREQ_SCALE": "--rope-freq-scale",
    "LLAMA_ARG_RPC": "--rpc",
    "LLAMA_ARG_SPEC_DRAFT_MODEL": "--spec-draft-model",
    "LLAMA_ARG_SPEC_DRAFT_N_MAX": "--spec-draft-n-max",
    "LLAMA_ARG_SPEC_DRAFT_N_MIN": "--spec-draft-n-min",
    "LLAMA_ARG_SPEC_DRAFT_P_MIN": "--spec-draft-p-min",
    "LLAMA_ARG_SPEC_TYPE": "--spec-type",
    "LLAMA_ARG_SPLIT_MODE": "-sm",
    "LLAMA_ARG_SSE_PING_INTERVAL": "--sse-ping-interval",
    "LLAMA_ARG_SSL_CERT_FILE": "--ssl-cert-file",
    "LLAMA_ARG_SSL_KEY_FILE": "--ssl-key-file",
    "LLAMA_ARG_SWA_FULL": "--swa-full",
    "LLAMA_ARG_TAGS": "--tags",
    "LLAMA_ARG_TEMPERATURE": "--temp",
    "LLAMA_ARG_TENSOR_SPLIT": "-ts",
    "LLAMA_ARG_THINK": "--reasoning-format",
    "LLAMA_ARG_THREADS": "-t",
    "LLAMA_ARG_THREADS_HTTP": "--threads-http",
    "LLAMA_ARG_TIMEOUT": "-to",
    "LLAMA_ARG_TOP_K": "--top-k",
    "LLAMA_ARG_TOP_P": "--top-p",
    "LLAMA_ARG_UBATCH": "-ub",
    "LLAMA_ARG_UI": "--ui",
    "LLAMA_ARG_YARN_ATTN_FACTOR": "--yarn-attn-factor",
    "LLAMA_ARG_YARN_BETA_FAST": "--yarn-beta-fast",
    "LLAMA_ARG_YARN_BETA_SLOW": "--yarn-beta-slow",
    "LLAMA_ARG_YARN_EXT_FACTOR": "--yarn-ext-factor",
    "LLAMA_ARG_YARN_ORIG_CTX": "--yarn-orig-ctx",
}
_TRUE = ("1", "true", "on", "enabled")
_FALSE = ("0", "false", "off", "disabled")


def env_argv(parser: argparse.ArgumentParser, argv: Sequence[str],
             environ: Mapping[str, str]) -> list[str]:
    """The flags the variables in ``environ`` stand for, minus those ``argv`` sets itself.
    Raises :class:`InvalidOptionError` for a switch variable that is not a yes/no word."""
    actions = parser._option_string_actions
    given = {actions[token.split("=", 1)[0]].dest for token in argv
             if token.startswith("-") and token.split("=", 1)[0] in actions}
    unread = sorted(k for k in environ if k.startswith("LLAMA_ARG_") and k not in LLAMA_ENV)
    if unread:
        log.warning("not read (no such flag here): %s", ", ".join(unread))
    out: list[str] = []
    for name, flag in LLAMA_ENV.items():
        value = environ.get(name)
        if value is None or actions[flag].dest in given:
            continue
        out += _tokens(parser, name, flag, value)
    return out


def _tokens(parser: argparse.ArgumentParser, name: str, flag: str, value: str) -> list[str]:
    action = parser._option_string_actions[flag]
    if action.nargs != 0:
        return [flag, value]
    word = value.strip().lower()
    if word not in _TRUE + _FALSE:
        raise InvalidOptionError(f"{name}={value!r}: expected one of "
                                 f"{', '.join(_TRUE + _FALSE)}", option=name)
    if word in _TRUE:
        return [flag]
    off = _off_flag(parser, action)
    return [off] if off else []


def _off_flag(parser: argparse.ArgumentParser, action: argparse.Action) -> str | None:
    """The flag that turns ``action``'s option off: its own ``--no-x`` spelling, or another
    flag storing False in the same place."""
    for option in action.option_strings:
        if option.lstrip("-").startswith("no-"):
            return option
    for other in parser._actions:
        if other is not action and other.dest == action.dest and getattr(other, "const", None) \
                is False and other.option_strings:
            return other.option_strings[0]
    return None
