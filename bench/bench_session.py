"""Workspace Session hot loop: a 2,000-token stable prefix, 10 turns each with a new 100-token
suffix and 64 decoded tokens. Per-turn time to first token, warm (prefix KV kept by
``ensure_prefix``) against cold (a changed manifest identity forces a full prefill).

Run: ``python bench/bench_session.py [--turns 10]`` (prints a Markdown table).
"""

from __future__ import annotations

import argparse
import statistics
import time

from llamapy.models import default_model_path
from llamapy.server import Server
from llamapy.session import DecodeConfig, PrefixInput, Session, SuffixInput

PREFIX_TOKENS, SUFFIX_TOKENS, DECODE_TOKENS = 2000, 100, 64


def tokens_of(server: Server, text: str, n: int, add_bos: bool) -> tuple[int, ...]:
    """Exactly ``n`` tokens of repeated ``text``."""
    ids = server.tokenize(text * (n // 4 + 8), add_bos)
    return tuple(ids[:n])


def turn(session: Session, prefix: PrefixInput, suffix: tuple[int, ...]) -> tuple[float, int]:
    """One turn; (seconds to the first streamed chunk, tokens reused by ensure_prefix)."""
    start = time.perf_counter()
    status = session.ensure_prefix(prefix)
    session.prefill_suffix(SuffixInput(token_ids=suffix))
    stream = session.decode(DecodeConfig(max_tokens=DECODE_TOKENS, temperature=0.0))
    ttft = None
    for _ in stream:
        if ttft is None:
            ttft = time.perf_counter() - start
    assert ttft is not None
    return ttft, status.reused_tokens


def main() -> None:
    """Run the loop and print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=10)
    args = parser.parse_args()
    with Server(default_model_path(), n_ctx=4096, n_parallel=1, n_batch=512) as server:
        server.wait_ready(120)
        prefix_ids = tokens_of(server, "def handler(request): return route(request)\n",
                               PREFIX_TOKENS, True)
        with server.open_session() as s:
            warm_prefix = PrefixInput(token_ids=prefix_ids)
            turn(s, warm_prefix, tokens_of(server, " warmup", SUFFIX_TOKENS, False))
            rows = []
            for i in range(args.turns):
                suffix = tokens_of(server, f" test {i} failed: assert x == {i}\n",
                                   SUFFIX_TOKENS, False)
                cold_manifest = s.base_manifest.replace(chat_template_digest=f"cold-{i}")
                cold, cold_reused = turn(s, PrefixInput(token_ids=prefix_ids,
                                                        manifest=cold_manifest), suffix)
                turn(s, warm_prefix, suffix)  # back to the base identity (cold again)
                warm, warm_reused = turn(s, warm_prefix, suffix)
                assert cold_reused == 0 and warm_reused == PREFIX_TOKENS
                rows.append((i, cold, warm))
    print("| turn | cold TTFT ms | warm TTFT ms | speedup |")
    print("|---:|---:|---:|---:|")
    for i, cold, warm in rows:
        print(f"| {i} | {cold * 1e3:.1f} | {warm * 1e3:.1f} | {cold / warm:.1f}x |")
    cold_med = statistics.median(r[1] for r in rows)
    warm_med = statistics.median(r[2] for r in rows)
    print(f"| median | {cold_med * 1e3:.1f} | {warm_med * 1e3:.1f} | "
          f"{cold_med / warm_med:.1f}x |")


if __name__ == "__main__":
    main()
