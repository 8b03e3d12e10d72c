"""llama-server's rules for choosing a repository's GGUF by quant tag (no network)."""

from __future__ import annotations

import pytest

from llamapy.errors import HubModelNotFoundError, InvalidOptionError
from llamapy.hub.select import choose_files, is_model_file, split_info
from llamapy.options.hub import HubOptions, parse_model_ref

FILES = ["README.md", "mmproj-m-Q4_K_M.gguf", "m-imatrix-Q4_K_M.gguf", "m-Q8_0.gguf",
         "m-Q4_K_M.gguf", "m-IQ4_XS.gguf", "m-F16-00002-of-00002.gguf",
         "m-F16-00001-of-00002.gguf"]


@pytest.mark.parametrize(("files", "tag", "chosen"), [
    (FILES, "", ["m-Q4_K_M.gguf"]),                         # the default tag first
    (["m-Q8_0.gguf", "m-Q5_K_M.gguf"], "", ["m-Q8_0.gguf"]),  # then Q8_0
    (["m-Q5_K_M.gguf", "mmproj-x.gguf"], "", ["m-Q5_K_M.gguf"]),  # then the first model
    (FILES, "iq4_xs", ["m-IQ4_XS.gguf"]),                   # a tag in any case
    (FILES, "F16", ["m-F16-00001-of-00002.gguf", "m-F16-00002-of-00002.gguf"]),
    (["a/m-Q4_K_M.gguf"], "Q4_K_M", ["a/m-Q4_K_M.gguf"]),   # in a folder
])
def test_choice_by_tag(files: list[str], tag: str, chosen: list[str]) -> None:
    assert choose_files("r", files, tag) == chosen


def test_a_tag_that_matches_nothing_has_no_fallback() -> None:
    with pytest.raises(HubModelNotFoundError) as caught:
        choose_files("r", FILES, "Q2_K")
    assert "m-Q8_0.gguf" in caught.value.available and "README.md" not in caught.value.available
    with pytest.raises(HubModelNotFoundError):
        choose_files("r", ["mmproj-only-Q4_K_M.gguf", "README.md"])  # a projector is no model


def test_a_split_gguf_missing_a_part_is_refused() -> None:
    with pytest.raises(HubModelNotFoundError, match="1 of its 2 parts"):
        choose_files("r", ["m-F16-00001-of-00002.gguf"], "F16")


def test_hf_file_is_taken_as_named_with_its_split_parts() -> None:
    assert choose_files("r", FILES, hf_file="m-Q8_0.gguf") == ["m-Q8_0.gguf"]
    assert len(choose_files("r", FILES, hf_file="m-F16-00001-of-00002.gguf")) == 2


def test_split_info_and_model_files() -> None:
    assert split_info("x/m-Q4_0-00002-of-00003.gguf").index == 2
    assert split_info("m.gguf").count == 1
    assert not is_model_file("mmproj-model-f16.gguf") and is_model_file("m-f16.gguf")


@pytest.mark.parametrize("name", ["", "org", "org/", "/repo", "org/repo/extra", "org/re po",
                                  "org/repo:", "org/repo:Q4 K", "org/repo:-x", "org/..x",
                                  "org/a--b", "x" * 300])
def test_bad_names_are_typed_errors(name: str) -> None:
    with pytest.raises(InvalidOptionError):
        parse_model_ref(name)


def test_names_normalise_as_ollama_names_hub_models() -> None:
    assert parse_model_ref("hf.co/Org/Repo-GGUF:q4_k_m").name == "hf.co/Org/Repo-GGUF:Q4_K_M"
    assert parse_model_ref("org/repo").name == "hf.co/org/repo:latest"
    assert parse_model_ref("huggingface.co/org/repo:UD-Q4_K_XL").tag == "UD-Q4_K_XL"


@pytest.mark.parametrize("options", [
    {"hf_file": "m.gguf"},                                   # -hff without -hf
    {"hf_repo": "o/r", "hf_file": "../m.gguf"},
    {"hf_repo": "o/r", "hf_file": "/abs/m.gguf"},
    {"hf_repo": "o/r", "hf_file": "m.bin"},
    {"hf_repo": "o/r", "hf_token": "has space"},
    {"hf_repo": "o/r", "hf_token": "tab\there"},
    {"hf_repo": "o/r", "hf_token": "x" * 2000},
])
def test_bad_hub_options_are_typed_errors(options: dict[str, object]) -> None:
    with pytest.raises(InvalidOptionError):
        HubOptions(**options)  # type: ignore[arg-type]
