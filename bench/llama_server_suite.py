"""Run llama.cpp's own server test suite (tools/server/tests) against llama-server or llamapy.

The suite is copied from the pinned llama.cpp source into a temporary directory (at the same
depth, with symlinks to the rest of the llama.cpp tree so ``../../../models/templates`` resolve)
and its ``utils.py`` gets one appended, clearly marked block (the original text is untouched):

* every server whose preset or test names a Hugging Face repo/file or a model URL is given the
  local ``--model`` file instead (there is no network here); ``--offline`` stays on the command
  line exactly as the preset sets it;
* ``download_file(<...>.gguf)`` (draft models, LoRA adapters) returns that local model file;
* ``ServerPreset.load_all()`` (a session-start warm-up that only exists to download models) is a
  no-op;
* servers that set no thread count get ``--threads N`` (``--threads``, default 2) so the run
  stays light on a shared machine;
* the vision preset (``tinygemma3``, whose projector its Hugging Face repo would bring) gets the
  local ``--mmproj`` file through ``LLAMA_ARG_MMPROJ`` (the tiny generated projector of the
  default model by default), and the two test images the vision tests download from Hugging
  Face with ``requests.get`` are made locally (a red and a blue 64x64 PNG): a URL the tests hand
  to the server itself stays remote, and the server must fetch it or refuse it.

Nothing a test asserts is changed. The binary is chosen through the suite's own
``LLAMA_SERVER_BIN_PATH``: the llama-server binary, or, for ``--target llamapy``, a small wrapper
that execs ``python3 -m llamapy.serve "$@"`` with this checkout first on ``sys.path``.
``--strip-flags`` (llamapy only, off by default) drops named boolean flags from the command line
before llamapy sees them, to measure what lies behind a flag llamapy rejects; ``--add-flags``
(llamapy only) appends flags (``--accept-any-model``: what lies behind the unknown-model 404).

Each ``unit/test_*.py`` file runs in its own pytest process (no xdist), one after another, with a
per-file wall-clock limit (``--timeout``) and, when pytest-timeout is installed, a per-test one
(``--test-timeout``). Per-file passed/failed/skipped/error counts and totals are printed, and
``--json`` writes every test's outcome and first failure line (recorded by a
small pytest plugin as each test ends, so a file cut off by its timeout keeps what it ran).

Run (the suite needs pytest, requests, aiohttp, openai, wget, filelock, prometheus-client,
numpy; pytest-timeout optional)::

    python bench/llama_server_suite.py --target llama-server --json /tmp/suite-llama.json
    python bench/llama_server_suite.py --target llamapy --json /tmp/suite-llamapy.json
    python bench/llama_server_suite.py --target llamapy --files test_basic test_tokenize
    python bench/llama_server_suite.py --compare /tmp/suite-llama.json /tmp/suite-llamapy.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from suite_report import FileSummary, TestResult, compare, print_table

REPO = Path(__file__).resolve().parent.parent
CACHE = Path.home() / ".cache" / "llamapy"
DEFAULT_SRC = CACHE / "src" / "llama.cpp-832db0699007f1be" / "tools" / "server" / "tests"
DEFAULT_BIN = CACHE / "build" / "5d96d3a5e8ef182b" / "bin" / "llama-server"
DEFAULT_MODEL = CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

PATCH_MARK = "# ---- appended by llamapy bench/llama_server_suite.py ----"
UTILS_PATCH = f"""

{PATCH_MARK}
# Local model for every preset/test instead of a Hugging Face download; no other change.
_SUITE_MODEL_FILE = os.environ["SUITE_MODEL_FILE"]
_SUITE_THREADS = int(os.environ.get("SUITE_THREADS", "0"))
_suite_orig_start = ServerProcess.start
_suite_orig_download_file = download_file


def _suite_start(self, timeout_seconds: int = DEFAULT_HTTP_TIMEOUT) -> None:
    if self.model_hf_repo or self.model_hf_file or self.model_url:
        self.model_file = _SUITE_MODEL_FILE
        self.model_hf_repo = None
        self.model_hf_file = None
        self.model_url = None
    if self.n_threads is None and _SUITE_THREADS > 0:
        self.n_threads = _SUITE_THREADS
    return _suite_orig_start(self, timeout_seconds)


def download_file(url: str, output_file_path: str | None = None) -> str:
    if url.split("?")[0].endswith(".gguf"):
        print(f"suite patch: {{url}} -> {{_SUITE_MODEL_FILE}}")
        return _SUITE_MODEL_FILE
    return _suite_orig_download_file(url, output_file_path)


_SUITE_MMPROJ_FILE = os.environ.get("SUITE_MMPROJ_FILE", "")


def _suite_png(rgb):
    import struct as _st, zlib as _z
    raw = (b"\\x00" + bytes(rgb) * 64) * 64
    def chunk(tag, data):
        return _st.pack(">I", len(data)) + tag + data + _st.pack(">I", _z.crc32(tag + data))
    return (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", _st.pack(">IIBBBBB", 64, 64, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", _z.compress(raw)) + chunk(b"IEND", b""))


class _SuiteImage:
    status_code = 200
    def __init__(self, content):
        self.content = content
    def raise_for_status(self):
        return None


_SUITE_IMAGES = {{"11_truck.png": (200, 40, 40), "91_cat.png": (40, 40, 200)}}
_suite_orig_get = requests.get


def _suite_get(url, *args, **kwargs):
    name = str(url).rsplit("/", 1)[-1]
    if "tinygemma3-GGUF" in str(url) and name in _SUITE_IMAGES:
        return _SuiteImage(_suite_png(_SUITE_IMAGES[name]))
    return _suite_orig_get(url, *args, **kwargs)


requests.get = _suite_get
_suite_plain_start = _suite_start


def _suite_start(self, timeout_seconds: int = DEFAULT_HTTP_TIMEOUT) -> None:
    vision = "tinygemma3" in str(self.model_hf_repo or "")
    if vision and _SUITE_MMPROJ_FILE:
        os.environ["LLAMA_ARG_MMPROJ"] = _SUITE_MMPROJ_FILE
    else:
        os.environ.pop("LLAMA_ARG_MMPROJ", None)
    return _suite_plain_start(self, timeout_seconds)


ServerProcess.start = _suite_start
ServerPreset.load_all = staticmethod(lambda: None)  # only downloads models
"""

LLAMAPY_WRAPPER = '''#!{python}
"""llama-server stand-in: exec python -m llamapy.serve from {repo}."""
import os
import sys

STRIP = {strip!r}
args = [a for a in sys.argv[1:] if a not in STRIP] + {add!r}
env = dict(os.environ)
env["PYTHONPATH"] = {repo!r} + os.pathsep + env.get("PYTHONPATH", "")
os.execve({python!r}, [{python!r}, "-m", "llamapy.serve", *args], env)
'''


REPORT_PLUGIN = """\"\"\"pytest plugin: append each outcome to $SUITE_REPORT as tests end.\"\"\"
import json
import os


def pytest_runtest_logreport(report):
    path = os.environ.get("SUITE_REPORT")
    if not path:
        return
    if report.when == "call" or report.outcome != "passed":
        if report.when != "call" and report.outcome == "failed":
            outcome = "error"
        else:
            outcome = report.outcome
        message = ""
        if report.outcome != "passed":
            crash = getattr(report.longrepr, "reprcrash", None)
            if crash is not None:
                message = crash.message
            elif isinstance(report.longrepr, tuple):
                message = str(report.longrepr[2])
            else:
                message = str(report.longrepr)
        line = {"test": report.nodeid.split("::", 1)[-1], "when": report.when,
                "outcome": outcome, "message": message.strip().splitlines()[0][:400]
                if message.strip() else ""}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\\n")
"""


def prepare_suite(src: Path, work: Path) -> Path:
    """Copy the suite to ``work/tools/server/tests`` and append the patch block to its utils.py.

    Tests open files by paths relative to the suite (``../../../models/templates/...``), so the
    copy keeps the suite's depth and every sibling on the way up to the llama.cpp root is a
    symlink to the original.
    """
    rel = Path("tools", "server", "tests")
    root = src.resolve().parents[len(rel.parts) - 1]
    here, there = work, root
    for part in rel.parts:
        for entry in there.iterdir():
            if entry.name != part:
                (here / entry.name).symlink_to(entry)
        here, there = here / part, there / part
        if part != rel.parts[-1]:
            here.mkdir()
    dst = work / rel
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("tmp", "__pycache__", ".pytest_cache"))
    utils = dst / "utils.py"
    text = utils.read_text()
    if PATCH_MARK not in text:
        utils.write_text(text + UTILS_PATCH)
    (dst / "tmp").mkdir(exist_ok=True)
    (dst / "_suite_report.py").write_text(REPORT_PLUGIN)
    return dst


def make_wrapper(work: Path, python: str, strip: list[str], add: list[str] | None = None
                 ) -> Path:
    """Write the executable llamapy stand-in for llama-server."""
    wrapper = work / "llamapy-server"
    wrapper.write_text(LLAMAPY_WRAPPER.format(python=python, repo=str(REPO), strip=strip,
                                              add=add or []))
    wrapper.chmod(0o755)
    return wrapper


def parse_report(path: Path, file_name: str) -> list[TestResult]:
    """Read the per-test JSON lines the plugin wrote (a later teardown error overrides a pass)."""
    by_test: dict[str, TestResult] = {}
    if not path.exists():
        return []
    for raw in path.read_text().splitlines():
        rec = json.loads(raw)
        prev = by_test.get(rec["test"])
        if prev is None or prev["outcome"] == "passed":
            by_test[rec["test"]] = TestResult(
                file=file_name, test=rec["test"], outcome=rec["outcome"], message=rec["message"]
            )
    return list(by_test.values())


def run_file(
    suite: Path,
    name: str,
    env: dict[str, str],
    timeout: float,
    test_timeout: int,
    log_dir: Path,
) -> tuple[FileSummary, list[TestResult]]:
    """Run one test file in its own pytest process; kill its process group past ``timeout``."""
    report = log_dir / f"{name}.jsonl"
    report.unlink(missing_ok=True)
    log = log_dir / f"{name}.log"
    cmd = [sys.executable, "-m", "pytest", f"unit/{name}.py", "-p", "no:cacheprovider", "-q"]
    cmd += ["-rfEs", "-p", "_suite_report"]
    env = {**env, "SUITE_REPORT": str(report), "PYTHONPATH": str(suite)}
    if test_timeout > 0 and importlib.util.find_spec("pytest_timeout") is not None:
        cmd += [f"--timeout={test_timeout}"]
    note = ""
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=suite, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            note = f"file timeout after {timeout:.0f}s"
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    seconds = time.monotonic() - start
    results = parse_report(report, name)
    if not results:
        note = note or f"no results (pytest rc={proc.returncode}), see {log}"
    summary = FileSummary(passed=0, failed=0, skipped=0, error=0, seconds=seconds, note=note)
    for r in results:
        key = r["outcome"]
        if key in ("passed", "failed", "skipped", "error"):
            summary[key] += 1  # type: ignore[literal-required]
    return summary, results


def parse_args() -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=["llama-server", "llamapy"], default="llama-server")
    ap.add_argument("--files", nargs="*", default=None, help="test files (test_basic or .py)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per test file")
    ap.add_argument("--test-timeout", type=int, default=180, help="seconds per test (0: off)")
    ap.add_argument("--src", type=Path, default=DEFAULT_SRC, help="tools/server/tests dir")
    ap.add_argument("--bin", type=Path, default=DEFAULT_BIN, help="llama-server binary")
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="local GGUF for presets")
    ap.add_argument("--mmproj", type=Path, default=CACHE / "models" / "tiny-mmproj.gguf",
                    help="local projector for the vision preset")
    ap.add_argument("--port", type=int, default=18473, help="base port (the suite's PORT)")
    ap.add_argument("--threads", type=int, default=2, help="--threads when a test sets none")
    ap.add_argument("--server-python", default=shutil.which("python3") or sys.executable)
    ap.add_argument("--strip-flags", default="", help="llamapy: comma-separated flags to drop")
    ap.add_argument("--add-flags", default="", help="llamapy: comma-separated flags to append")
    ap.add_argument("--json", type=Path, default=None, help="write per-test outcomes here")
    ap.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="keep pytest logs and per-file JSONL here (default: in the temp copy)",
    )
    ap.add_argument(
        "--update",
        action="store_true",
        help="merge into an existing --json: files run now replace their old entries",
    )
    ap.add_argument("--keep", action="store_true", help="keep the temporary suite copy")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BASE_JSON", "OTHER_JSON"))
    return ap, ap.parse_args()


def chosen_files(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The test files to run: ``--files`` (checked against the suite), else every one."""
    all_files = sorted(p.stem for p in (args.src / "unit").glob("test_*.py"))
    if not args.files:
        return all_files
    wanted = [Path(f).stem if f.startswith("test_") else f"test_{Path(f).stem}"
              for f in args.files]
    missing = [f for f in wanted if f not in all_files]
    if missing:
        ap.error(f"unknown test files: {missing}")
    return wanted


def suite_env(args: argparse.Namespace, binary: Path) -> dict[str, str]:
    """The suite's environment: our target binary, model, threads and port."""
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG_EXTERNAL", "DEBUG")}
    env.update(LLAMA_SERVER_BIN_PATH=str(binary), SUITE_MODEL_FILE=str(args.model),
               SUITE_THREADS=str(args.threads), PORT=str(args.port),
               SUITE_MMPROJ_FILE=str(args.mmproj),
               PYTHONDONTWRITEBYTECODE="1")
    return env


def main() -> int:
    """Parse arguments, run the chosen files against the target, print and save results."""
    ap, args = parse_args()
    if args.compare:
        compare(*args.compare)
        return 0
    files = chosen_files(ap, args)
    work = Path(tempfile.mkdtemp(prefix="llama-server-suite-"))
    suite = prepare_suite(args.src, work)
    log_dir = args.log_dir or (work / "logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    strip = [f for f in args.strip_flags.split(",") if f]
    binary = args.bin if args.target == "llama-server" else make_wrapper(
        work, args.server_python, strip, [f for f in args.add_flags.split(",") if f])
    env = suite_env(args, binary)
    print(f"target={args.target} binary={binary} suite={suite} logs={log_dir}", flush=True)
    summaries: dict[str, FileSummary] = {}
    tests: list[TestResult] = []
    if args.update and args.json and args.json.exists():
        old = json.loads(args.json.read_text())
        summaries.update({k: v for k, v in old["summaries"].items() if k not in files})
        tests.extend(t for t in old["tests"] if t["file"] not in files)
    try:
        run_all(files, suite, env, args, log_dir, strip, summaries, tests)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print_table(summaries)
    return 0


def run_all(
    files: list[str],
    suite: Path,
    env: dict[str, str],
    args: argparse.Namespace,
    log_dir: Path,
    strip: list[str],
    summaries: dict[str, FileSummary],
    tests: list[TestResult],
) -> None:
    """Run the files one after another, printing each summary and rewriting --json after each."""
    for name in files:
        summary, results = run_file(suite, name, env, args.timeout, args.test_timeout, log_dir)
        summaries[name] = summary
        tests[:] = [t for t in tests if t["file"] != name] + results
        s = summary
        print(
            f"{name}: {s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped,"
            f" {s['error']} errors in {s['seconds']:.0f}s {s['note']}",
            flush=True,
        )
        if args.json:  # rewrite after every file so a partial run still leaves results
            args.json.write_text(
                json.dumps(
                    {
                        "target": args.target,
                        "strip_flags": strip,
                        "add_flags": args.add_flags,
                        "model": str(args.model),
                        "files": list(summaries),
                        "summaries": summaries,
                        "tests": tests,
                    },
                    indent=1,
                )
            )


if __name__ == "__main__":
    sys.exit(main())
