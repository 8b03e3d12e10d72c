"""Options of getting a model by name from the Hugging Face Hub: llama-server's ``-hf`` /
``-hff`` / ``--hf-token`` / ``--offline``, the limits of pulls that requests cause
(``--pull-on-demand``, ``--pull-allow``, ``--pull-max-bytes``), and the name grammar they and
the local store share.

A name is ``[hf.co/]ORG/REPO[:TAG]``: ``ORG/REPO`` a Hub repository, ``TAG`` a quant tag
(``Q4_K_M``, ``q8_0``, ``UD-Q4_K_XL``) matched without regard to case; no tag (or Ollama's
``latest``) means llama-server's default (``Q4_K_M``, else ``Q8_0``, else the first GGUF).
:func:`parse_model_ref` checks a name once, at the edge, and raises
:class:`~llamapy.errors.InvalidOptionError` for a bad one: the operator's names (``-hf``,
``python -m llamapy pull``) may leave the host out. A request's name pulls only when it spells
the Hub out, as Ollama's do (``hf.co/ORG/REPO[:TAG]``, :func:`parse_pull_name`): a bare
``ORG/REPO`` in a request is an unknown model, never a download. Pure Python, like the rest of
the tree.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from llamapy.options._spec import check, option

__all__ = ["DEFAULT_PULL_MAX_BYTES", "MAX_NAME_CHARS", "HubOptions", "ModelRef",
           "check_hf_file", "check_hf_token", "check_pull_pattern", "hub_option_keys",
           "is_pull_name", "parse_model_ref", "parse_pull_name", "pull_allowed"]

#: The longest model name accepted (a repository id is at most 96 characters on the Hub).
MAX_NAME_CHARS = 256
#: The longest token accepted (Hub tokens are about 40 characters).
MAX_TOKEN_CHARS = 1024
#: Prefixes of an Ollama-style name that mean the Hub (``hf.co/org/repo:Q4_K_M``).
HUB_HOSTS = ("hf.co/", "huggingface.co/")
#: The most bytes a pull that a request causes may download unless ``--pull-max-bytes`` says
#: otherwise (16 GiB: a 27B model at Q4_K_M; the operator's ``-hf`` has no cap).
DEFAULT_PULL_MAX_BYTES = 16 * 1024**3
#: The most ``--pull-allow`` patterns.
MAX_PULL_PATTERNS = 256

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO = re.compile(rf"^{_PART}/{_PART}$")
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_FILE = re.compile(r"^[A-Za-z0-9_.+\-/ ]{1,512}$")
_TOKEN = re.compile(rf"^[\x21-\x7e]{{1,{MAX_TOKEN_CHARS}}}$")
_GLOB_PART = r"[A-Za-z0-9._*?-]{1,96}"
_PULL_PATTERN = re.compile(rf"^{_GLOB_PART}/{_GLOB_PART}$")


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A checked model name: a Hub repository and a quant tag, upper case ("" = the default
    choice)."""

    repo: str
    tag: str = ""

    @property
    def name(self) -> str:
        """The store's name for it, as Ollama spells Hub models: ``hf.co/ORG/REPO:TAG``
        (``:latest`` for the default choice)."""
        return f"hf.co/{self.repo}:{self.tag or 'latest'}"


def parse_model_ref(text: str, option: str = "hf_repo") -> ModelRef:
    """``[hf.co/]ORG/REPO[:TAG]`` as a :class:`ModelRef`; :class:`InvalidOptionError` names
    ``option`` for anything else (empty, a bad repository id, a bad or empty tag)."""
    check(isinstance(text, str) and 0 < len(text) <= MAX_NAME_CHARS, option,
          f"expected ORG/REPO[:QUANT] of at most {MAX_NAME_CHARS} characters, got {text!r}")
    body = text
    for host in HUB_HOSTS:
        if body.lower().startswith(host):
            body = body[len(host):]
    repo, colon, tag = body.partition(":")
    check(_REPO.match(repo) is not None and ".." not in repo and "--" not in repo, option,
          f"expected a Hub repository ORG/REPO, got {repo!r}")
    if colon:
        check(_TAG.match(tag) is not None, option,
              f"expected a quant tag such as Q4_K_M after ':', got {tag!r}")
    tag = tag.upper()
    return ModelRef(repo=repo, tag="" if tag == "LATEST" else tag)


def is_pull_name(text: str) -> bool:
    """Whether a requested model name spells the Hub out (``hf.co/...``, as Ollama's pull
    names do): only such a name may make the server download (:func:`parse_pull_name`)."""
    return isinstance(text, str) and text.lower().startswith(HUB_HOSTS)


def parse_pull_name(text: str, option: str = "model") -> ModelRef:
    """A request's ``hf.co/ORG/REPO[:TAG]`` (or ``huggingface.co/...``) as a
    :class:`ModelRef`; :class:`InvalidOptionError` for anything else, a bare ``ORG/REPO``
    included (that is the operator's spelling, not a request's)."""
    check(is_pull_name(text), option,
          f"expected hf.co/ORG/REPO[:QUANT] to pull a Hub model, got {str(text)[:80]!r}")
    return parse_model_ref(text, option=option)


def check_pull_pattern(pattern: str, option: str = "pull_allow") -> str:
    """A ``--pull-allow`` pattern: ``ORG/REPO`` of repository characters and the glob
    characters ``*`` and ``?`` (``ggml-org/*``)."""
    check(isinstance(pattern, str) and _PULL_PATTERN.match(pattern) is not None, option,
          f"expected an ORG/REPO pattern such as ggml-org/* (letters, digits, ._- and the "
          f"globs * ?), got {pattern!r}")
    return pattern


def pull_allowed(repo: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``repo`` (``ORG/REPO``) matches one of ``patterns`` (case-sensitive globs: a
    ``*`` matches any characters, ``/`` included); no patterns allow every repository."""
    return not patterns or any(fnmatch.fnmatchcase(repo, p) for p in patterns)


def check_hf_file(path: str, option: str = "hf_file") -> str:
    """A file path inside a repository (``-hff``): relative, no ``..``, ends in ``.gguf``."""
    check(isinstance(path, str) and _FILE.match(path) is not None, option,
          f"expected a relative file path in the repository, got {path!r}")
    parts = path.split("/")
    check(not path.startswith("/") and ".." not in parts and "" not in parts, option,
          f"expected a relative file path without '..', got {path!r}")
    check(path.lower().endswith(".gguf"), option, f"expected a .gguf file, got {path!r}")
    return path


def check_hf_token(token: str, option: str = "hf_token") -> str:
    """A Hub access token: printable ASCII without spaces, at most :data:`MAX_TOKEN_CHARS`."""
    check(isinstance(token, str) and _TOKEN.match(token) is not None, option,
          f"expected a token of printable characters without spaces (at most "
          f"{MAX_TOKEN_CHARS}), got one of {len(token) if isinstance(token, str) else 0}")
    return token


@dataclass(frozen=True, slots=True, kw_only=True)
class HubOptions:
    """Where a served model comes from when it is named rather than given as a file."""

    hf_repo: str = option("", "Hub repository ORG/REPO[:QUANT] to download and serve (quant "
                          "tag: case-insensitive, default Q4_K_M, else Q8_0, else the first "
                          "GGUF)", flags=("-hf", "-hfr"))
    hf_file: str = option("", "file of --hf-repo to serve instead of choosing by quant tag",
                          flags=("-hff",))
    hf_token: str = option("", "Hub access token for gated or private repositories (default: "
                           "$HF_TOKEN, else huggingface_hub's stored login)", flags=("-hft",))
    offline: bool = option(False, "no network at all: use models from the local cache only "
                           "(a missing one is an error)")
    pull_on_demand: bool = option(False, "pull a Hub model a request names (hf.co/ORG/REPO:"
                                  "QUANT; a bare ORG/REPO is an unknown model) into "
                                  "--models-dir and serve it; when API keys carry tenants, "
                                  "admin keys only (default: off)")
    pull_allow: tuple[str, ...] = option((), "with --pull-on-demand, the only repositories a "
                                         "request may pull: ORG/REPO globs such as ggml-org/*, "
                                         "case-sensitive, repeatable or comma-separated "
                                         "(default: any)")
    pull_max_bytes: int = option(DEFAULT_PULL_MAX_BYTES, "with --pull-on-demand, the most "
                                 "bytes one pull a request causes may download, checked "
                                 "against the Hub's file listing before anything downloads; "
                                 "0 = no cap (-hf has none) (default: 16 GiB)")

    def __post_init__(self) -> None:
        if self.hf_repo:
            parse_model_ref(self.hf_repo)
        if self.hf_file:
            check(bool(self.hf_repo), "hf_file", "--hf-file needs --hf-repo")
            check_hf_file(self.hf_file)
        if self.hf_token:
            check_hf_token(self.hf_token)
        check(isinstance(self.offline, bool), "offline", "expected a bool")
        check(isinstance(self.pull_on_demand, bool), "pull_on_demand", "expected a bool")
        check(not (self.offline and self.pull_on_demand), "pull_on_demand",
              "--pull-on-demand downloads: it cannot be used with --offline")
        self._check_pull_limits()

    def _check_pull_limits(self) -> None:
        check(isinstance(self.pull_allow, tuple) and len(self.pull_allow) <= MAX_PULL_PATTERNS,
              "pull_allow", f"expected a tuple of at most {MAX_PULL_PATTERNS} patterns")
        for pattern in self.pull_allow:
            check_pull_pattern(pattern)
        check(not self.pull_allow or self.pull_on_demand, "pull_allow",
              "--pull-allow limits --pull-on-demand: give both")
        check(isinstance(self.pull_max_bytes, int) and not isinstance(self.pull_max_bytes, bool)
              and 0 <= self.pull_max_bytes < 2**63, "pull_max_bytes",
              f"expected a number of bytes >= 0 (0: no cap), got {self.pull_max_bytes!r}")

    @property
    def ref(self) -> ModelRef | None:
        """``hf_repo`` parsed (None when no repository is named)."""
        return parse_model_ref(self.hf_repo) if self.hf_repo else None


def hub_option_keys() -> tuple[str, ...]:
    """Every hub option name."""
    return tuple(HubOptions.__dataclass_fields__)
