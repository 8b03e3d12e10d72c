"""``python -m llamapy show``: the GGUF header's metadata of a pulled model, read without
loading it; a header that is truncated or claims too much is a typed error."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hub_standin import HubStandin, Repo

from llamapy.__main__ import main
from llamapy.errors import InvalidOptionError
from llamapy.hub.gguf_meta import MAX_KV, read_gguf_metadata
from llamapy.models import default_model_path


def test_show_prints_the_gguf_metadata(hub_env: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    repo = Repo({"smol-Q4_K_M.gguf": default_model_path(), "smol-Q8_0.gguf": b"GGUF\x09"})
    with HubStandin({"org/smol-GGUF": repo}) as standin:
        monkeypatch.setenv("HF_ENDPOINT", standin.url)
        assert main(["pull", "org/smol-GGUF", "--alias", "smol"]) == 0
        assert main(["pull", "org/smol-GGUF:Q8_0", "--alias", "broken"]) == 0
    capsys.readouterr()
    assert main(["show", "smol"]) == 0
    gguf = json.loads(capsys.readouterr().out)["gguf"]
    assert gguf["general.architecture"] == "llama" and gguf["llama.block_count"] == 30
    assert gguf["gguf.tensor_count"] > 0 and gguf["llama.context_length"] > 0
    assert main(["show", "broken"]) == 0  # the record is shown; the header's error with it
    assert "truncated" in json.loads(capsys.readouterr().out)["gguf"]["error"]


@pytest.mark.parametrize("header", [
    b"", b"GGML", b"GGUF" + struct.pack("<I", 9),
    b"GGUF" + struct.pack("<IQQ", 3, 0, MAX_KV + 1),
    b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 40),  # a huge key
    b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 99),
])
def test_a_bad_header_is_a_typed_error(tmp_path: Path, header: bytes) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(header)
    with pytest.raises(InvalidOptionError):
        read_gguf_metadata(path)
