"""Downloading a model by name through huggingface_hub from the local Hub stand-in: the choice
by quant tag, split GGUFs, resume after a broken transfer, checksum verification, offline reuse
of the cache, typed errors for what does not exist; nothing half written is left behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from hub_standin import TINY, HubStandin, Repo, blobs, tiny_files

from llamapy.errors import (
    ChecksumMismatchError,
    HubError,
    HubModelNotFoundError,
    InvalidOptionError,
    OfflineModelMissingError,
)
from llamapy.hub import HubAccess, fetch_model
from llamapy.options.hub import parse_model_ref


def fetch(name: str, hf_file: str = "", token: str = "", offline: bool = False):  # type: ignore[no-untyped-def]
    return fetch_model(parse_model_ref(name), HubAccess.from_env(token, offline), hf_file)


def test_a_clean_cache_gets_the_default_quant_not_the_projector(hub: HubStandin,
                                                               hub_env: Path) -> None:
    got = fetch(TINY)
    assert got.path.name == "tiny-Q4_K_M.gguf"
    assert got.path.read_bytes() == tiny_files()["tiny-Q4_K_M.gguf"]
    assert got.path.is_relative_to(hub_env / "hub" / "models--org--tiny-GGUF" / "snapshots")
    assert [m for m, _ in hub.file_requests("mmproj-tiny-Q4_K_M.gguf")] == []
    assert got.files[0].sha256 and got.revision == "c" * 40


@pytest.mark.parametrize(("tag", "name"), [("Q8_0", "tiny-Q8_0.gguf"),
                                           ("q8_0", "tiny-Q8_0.gguf"),
                                           ("q4_k_m", "tiny-Q4_K_M.gguf")])
def test_an_explicit_tag_matches_without_regard_to_case(hub: HubStandin, tag: str,
                                                       name: str) -> None:
    assert fetch(f"{TINY}:{tag}").path.name == name


def test_hf_file_names_the_file_outright(hub: HubStandin) -> None:
    assert fetch(TINY, hf_file="tiny-Q8_0.gguf").path.name == "tiny-Q8_0.gguf"
    with pytest.raises(HubModelNotFoundError, match=r"tiny-Q8_0\.gguf"):
        fetch(TINY, hf_file="absent.gguf")  # the error lists the GGUF files there are


def test_a_split_gguf_is_downloaded_whole_first_part_first(hub: HubStandin) -> None:
    got = fetch(f"{TINY}:F16")
    assert [p.name for p in got.paths] == ["tiny-F16-00001-of-00002.gguf",
                                           "tiny-F16-00002-of-00002.gguf"]
    assert got.paths[0].parent == got.paths[1].parent  # llama.cpp finds the parts beside
    assert got.size == 1000


def test_a_broken_transfer_resumes_with_a_range_request(hub_env: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # huggingface_hub writes in 10 MiB chunks: the connection drops after 12 MiB of 24 MiB
    big = bytes(range(256)) * (24 * 4096)
    repo = Repo({**tiny_files(), "tiny-Q4_K_M.gguf": big}, drop_once={"tiny-Q4_K_M.gguf"})
    with HubStandin({TINY: repo}) as standin:
        monkeypatch.setenv("HF_ENDPOINT", standin.url)
        got = fetch(TINY)
        gets = [h for m, h in standin.file_requests("tiny-Q4_K_M.gguf") if m == "GET"]
    assert got.path.read_bytes() == big
    assert len(gets) == 2 and "range" not in gets[0]
    start = int(gets[1]["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= len(big) // 2  # resumed where the written part ends


def test_a_checksum_mismatch_is_typed_and_nothing_is_kept(hub_env: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    repo = Repo(tiny_files(), corrupt={"tiny-Q4_K_M.gguf"})
    with HubStandin({TINY: repo}) as standin:
        monkeypatch.setenv("HF_ENDPOINT", standin.url)
        with pytest.raises(ChecksumMismatchError) as caught:
            fetch(TINY)
    assert caught.value.expected == "0" * 64 and caught.value.path == "tiny-Q4_K_M.gguf"
    assert blobs(hub_env) == []
    assert not list((hub_env / "hub").rglob("tiny-Q4_K_M.gguf"))
    assert not list((hub_env / "hub").rglob("*.incomplete"))


def test_offline_reuses_the_cache_with_the_hub_gone(hub: HubStandin) -> None:
    online = fetch(f"{TINY}:Q8_0")
    hub.stop()
    offline = fetch(f"{TINY}:q8_0", offline=True)
    assert offline.path == online.path and offline.path.is_file()
    with pytest.raises(OfflineModelMissingError, match="Q4_K_M"):
        fetch(f"{TINY}:Q4_K_M", offline=True)  # cached repo, tag not cached
    with pytest.raises(OfflineModelMissingError, match="not in the local cache"):
        fetch("org/never-pulled", offline=True)


def test_a_missing_repo_or_tag_is_typed_and_leaves_nothing(hub: HubStandin,
                                                           hub_env: Path) -> None:
    with pytest.raises(HubModelNotFoundError, match="no repository org/absent"):
        fetch("org/absent:Q4_K_M")
    with pytest.raises(HubModelNotFoundError, match="quant tag 'Q2_K'") as caught:
        fetch(f"{TINY}:Q2_K")
    assert "tiny-Q8_0.gguf" in caught.value.available
    assert blobs(hub_env) == []


def test_a_gated_repo_needs_its_token(hub_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with HubStandin({TINY: Repo(tiny_files(), token="hf_secret")}) as standin:
        monkeypatch.setenv("HF_ENDPOINT", standin.url)
        with pytest.raises(HubError, match="gated"):
            fetch(TINY)
        assert fetch(TINY, token="hf_secret").path.is_file()
        monkeypatch.setenv("HF_TOKEN", "hf_secret")
        assert fetch(f"{TINY}:Q8_0").path.is_file()  # HF_TOKEN when no flag
        auth = {h.get("authorization") for m, p, h in standin.requests if "resolve" in p}
    assert auth == {"Bearer hf_secret"}


def test_an_unreachable_hub_is_a_typed_error(hub_env: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    standin = HubStandin({})
    monkeypatch.setenv("HF_ENDPOINT", standin.url)
    standin.stop()  # nothing listens there
    with pytest.raises(HubError):
        fetch(TINY)


@pytest.mark.parametrize(("name", "value"), [("HF_ENDPOINT", "ftp://mirror"),
                                             ("HF_TOKEN", "two words")])
def test_bad_environment_values_are_typed_errors(hub_env: Path, name: str, value: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidOptionError, match=name):
        HubAccess.from_env()
