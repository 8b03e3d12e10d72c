"""llama-server's flags without an option of their own (:mod:`llamapy.serve.flags.compat`):
HTTPS, an API key file, the load mode, a log file, and the accepted no-ops."""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trustme
from http_helpers import WAIT_S, free_port, poll

from llamapy.serve.__main__ import main
from llamapy.serve.cli import build_parser
from llamapy.serve.flags.serving import app_options
from llamapy.serve.flags.start import serve_start_options


def test_https_key_file_load_mode_and_log_file(model_path: Path, tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    key_file, cert_file = tmp_path / "key.pem", tmp_path / "cert.pem"
    cert.private_key_pem.write_to_path(str(key_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    (tmp_path / "keys.txt").write_text("# team keys\nalpha\n\nbeta\n", encoding="utf-8")
    port, log_file = free_port(), tmp_path / "server.log"
    command = [sys.executable, "-m", "llamapy.serve", "-m", str(model_path), "-c", "1024",
               "--port", str(port), "--ssl-key-file", str(key_file), "--ssl-cert-file",
               str(cert_file), "--api-key-file", str(tmp_path / "keys.txt"), "-lm", "none",
               "--log-file", str(log_file), "-cb", "--threads-http", "4", "-to", "30",
               "--no-log-timestamps", "-lv", "3", "--log-colors", "on"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    try:
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", timeout=60, verify=context,
                          headers={"Authorization": "Bearer beta"}) as http:
            assert poll(http, "/health", 200).json() == {"status": "ok"}
            assert http.get("/v1/models").status_code == 200
            assert http.get("/v1/models", headers={"Authorization": "Bearer # team keys"}
                            ).status_code == 401
            maps = Path(f"/proc/{process.pid}/maps").read_text(encoding="utf-8")
            assert str(model_path) not in maps  # -lm none: read, not memory-mapped
    finally:
        process.terminate()
        process.wait(WAIT_S)
    log = log_file.read_text(encoding="utf-8")
    assert f"https://127.0.0.1:{port}/" in log
    # --no-log-timestamps: the level first; a log file is never coloured
    assert log.startswith("INFO llamapy") and "\x1b[" not in log


@pytest.mark.parametrize(("argv", "expected"), [
    ([], {}),
    (["-lm", "none"], {"use_mmap": False, "use_mlock": False, "use_direct_io": False}),
    (["--load-mode", "mmap+mlock"], {"use_mmap": True, "use_mlock": True,
                                     "use_direct_io": False}),
    (["-lm", "dio"], {"use_direct_io": True}),
    (["-lm", "none", "--use-mmap"], {"use_mmap": True, "use_mlock": False,
                                     "use_direct_io": False}),
])
def test_load_mode_sets_the_model_options_not_given(argv: list[str],
                                                    expected: dict[str, bool]) -> None:
    options = serve_start_options(build_parser().parse_args(argv))
    assert {k: options[k] for k in ("use_mmap", "use_mlock", "use_direct_io")
            if k in options} == expected


def test_api_key_file_keys_join_the_api_keys(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("#c\nk1\nk2\n", encoding="utf-8")
    args = build_parser().parse_args(["--api-key", "k0", "--api-key-file", str(tmp_path / "k")])
    assert [key for key, _ in app_options(args)["api_keys"].entries] == ["k0", "k1", "k2"]
    assert not app_options(args)["api_keys"].tenancy
    assert app_options(build_parser().parse_args([]))["api_keys"] is None


@pytest.mark.parametrize(("argv", "message"), [
    (["-nocb"], "batching is always continuous"),
    (["--ssl-key-file", "k.pem"], "needs both --ssl-key-file and --ssl-cert-file"),
    (["--api-key-file", "/nonexistent/keys"], "/nonexistent/keys"),
])
def test_what_cannot_be_honoured_is_refused_before_loading(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "/nonexistent/model.gguf", *argv]) == 2
    assert message in capsys.readouterr().err
