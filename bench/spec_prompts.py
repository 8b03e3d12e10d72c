"""The prompts of ``bench/bench_speculative.py``: (a) input-grounded ones whose answer mostly
copies the prompt (code from this repo to rewrite with one identifier renamed, a paragraph to
quote back with two edits, a JSON config to reproduce with one value changed) and (b)
open-ended ones with little to copy. Four of each, so a 4-stream wave is 4 distinct requests.
"""

from __future__ import annotations

from dataclasses import dataclass

#: ``DecodeCost`` from ``llamapy/engine/speculation/speculator.py`` (about 390 tokens).
CODE_DECODECOST = '''\
class DecodeCost:
    """The marginal cost of a batch token relative to a one-token decode (``beta``), fitted
    to ``seconds = a + b * n_tokens`` over recent decodes (exponentially forgotten)."""

    def __init__(self, prior_beta: float, decay: float = 0.98) -> None:
        self.prior_beta = prior_beta
        self.decay = decay
        self._s = [0.0] * 5  # weight, sum n, sum n^2, sum t, sum n*t

    def record(self, n_tokens: int, seconds: float) -> None:
        """Add one decode's size and duration."""
        d, s = self.decay, self._s
        for i, v in enumerate((1.0, n_tokens, n_tokens * n_tokens, seconds,
                               n_tokens * seconds)):
            s[i] = d * s[i] + v

    @property
    def beta(self) -> float:
        """``b / (a + b)``, clamped to [0.01, 1]; the prior until sizes vary enough."""
        w, sn, snn, st, snt = self._s
        var = w * snn - sn * sn
        if w < 4 or var <= 1e-9 * max(1.0, w * snn):
            return self.prior_beta
        b = (w * snt - sn * st) / var
        a = (st - b * sn) / w
        if b <= 0 or a + b <= 0:
            return self.prior_beta
        return min(1.0, max(0.01, b / (a + b)))
'''

#: ``start`` and ``stop`` from ``bench/http_load.py`` (about 290 tokens).
CODE_START = '''\
def start(cmd: list[str], port: int, timeout: float = 120.0, cwd: str | None = None
          ) -> tuple[subprocess.Popen[bytes], float]:
    """Start a server; returns it and the seconds until ``/health`` answered 200."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
    while time.perf_counter() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited with status {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"{cmd[0]} did not become healthy")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
'''

PARAGRAPH = """\
The harbor at Kelmouth wakes before the town does. By five on a Tuesday morning the first \
trawlers are already easing past the breakwater, their decks stacked with crates of ice, and \
the gulls follow them in a loose white cloud. On the quay the auction house opens its doors at \
six; buyers from the inland restaurants stand in a half circle, coffee in one hand and a \
notebook in the other, while the auctioneer calls out weights and prices faster than a \
stranger could follow. By eight the fish are gone, loaded into refrigerated vans that climb \
the hill road toward the motorway, and the harbor belongs to the tourists, who photograph the \
painted boats and buy ice cream from the kiosk beside the lifeboat station. The fishermen, \
meanwhile, mend their nets in the shade of the old customs house and talk about the weather, \
which in Kelmouth is the only subject that never runs out."""

CONFIG = """\
{
  "server": {
    "host": "127.0.0.1",
    "port": 8080,
    "workers": 4,
    "timeout_s": 30,
    "log_level": "info",
    "cors_origins": ["https://example.com", "https://app.example.com"]
  },
  "model": {
    "path": "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "n_ctx": 8192,
    "n_batch": 2048,
    "n_parallel": 4,
    "threads": 2,
    "flash_attn": "auto"
  },
  "sampling": {
    "temperature": 0.7,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "repeat_penalty": 1.1,
    "seed": 1234
  },
  "cache": {
    "prompt_cache_ram_mb": 512,
    "kv_unified": true,
    "cache_prompt": true
  }
}"""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One chat request: ``key`` names it, ``cls`` is its class (``a`` or ``b``)."""

    key: str
    cls: str
    text: str


PROMPTS = (
    Prompt("code-decodecost", "a", "Rewrite the following Python code exactly as it is, but "
           "rename `prior_beta` to `default_beta` everywhere. Output only the code.\n\n"
           f"```python\n{CODE_DECODECOST}```"),
    Prompt("code-start", "a", "Rewrite the following Python code exactly as it is, but rename "
           "the variable `proc` to `process` everywhere. Output only the code.\n\n"
           f"```python\n{CODE_START}```"),
    Prompt("quote-paragraph", "a", "Quote the following paragraph back word for word, with two "
           "edits: write 'Friday' instead of 'Tuesday' and 'lighthouse' instead of 'lifeboat "
           f"station'. Output only the paragraph.\n\n{PARAGRAPH}"),
    Prompt("config-json", "a", "Reproduce this JSON configuration exactly, changing only "
           "\"log_level\" from \"info\" to \"debug\". Output only the JSON.\n\n"
           f"```json\n{CONFIG}\n```"),
    Prompt("story", "b", "Write a long story about a lighthouse keeper who finds a small robot "
           "washed up on the beach after a storm."),
    Prompt("explain", "b", "Explain in detail how a hash table works: hashing, buckets, "
           "collisions, resizing, and the cost of each operation."),
    Prompt("ideas", "b", "List twenty ideas for weekend programming projects for a beginner, "
           "with two sentences about each."),
    Prompt("essay", "b", "Write an essay on the history of the bicycle, from the first "
           "designs to modern electric bikes."),
)
