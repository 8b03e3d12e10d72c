#!/usr/bin/env python3
"""Soak: N minutes of mixed traffic on a real ``python -m llamapy.serve``.

Starts this checkout's server as a subprocess (``--model`` or the default model; loopback, a
free port; embeddings served, checked with one request before the traffic), then runs
``--workers`` asyncio clients (httpx) until ``--minutes`` have passed. Each picks a valid
request (chat, streamed chat read to the end, a stream closed after its first chunk, a socket
dropped mid-request, ``n=2``, two ``/completion`` prompts, two embedding inputs; see
``soak_inputs.py``) or, at ``--bad-rate``, a hostile body. Beside them a monitor asks
``/health`` every second and reads the server's ``VmRSS`` from ``/proc/<pid>/status`` every
``--rss-every`` seconds. After the traffic, the slots must become idle and one more chat must
answer 200.

Printed: a markdown table of requests by kind and outcome class (2xx, 4xx, 5xx, connection
error, timeout) with p50/p99 latency of the valid ones, the 4xx by status, the hostile bodies'
answers, RSS over time (first, min, max, last, slope after warm-up), and whether ``/health``
stayed 200 and the process alive. Exit status 1 when the server died or stopped answering
``/health`` with 200, answered a valid request with a 5xx, did not drain, or its RSS grew more
than ``--max-rss-growth-mb`` after warm-up. A stopped server's likely culprits (the hostile
bodies sent since its last healthy ``/health``) are printed; ``--restarts N`` restarts it up
to N times to find more.

Usage: ``python bench/soak.py [--minutes 20] [--workers 4] [--bad-rate 0.1] [--model PATH]
[--seed 1] [--restarts 0] [--heavy]`` (run nothing else on the machine meanwhile).

``--tenants`` (``soak_tenants.py``) runs two tenants instead: a well-behaved one (one client,
small chats) alone for ``--solo-seconds``, then beside a bad one (the other workers: the valid
mix and, at ``--bad-rate``, the hostile classes of ``soak_tenant_inputs.py``) for
``--minutes``; it reports the good tenant's latency against its solo latency, each hostile
request's answers, RSS and ``/health``, and exits 1 when the good tenant got a non-2xx, any
request a 5xx, the server stopped, the Hub was contacted, or RSS grew past the bound.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import socket
import sys
import time
from pathlib import Path

import httpx
from soak_inputs import CHAT, JSON_TYPE, Req, hostile_bodies, valid
from soak_report import Death, Tally, outcome, report

ROOT = Path(__file__).resolve().parents[1]
#: Seconds a client waits for one answer (the server's own timeout is longer).
CLIENT_TIMEOUT_S = 60.0
#: Consecutive failed ``/health`` checks (errors or timeouts) that count as a stopped server.
HEALTH_STRIKES = 3


def free_port() -> int:
    """A port free on the loopback now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """The server process: started, watched, stopped (its output goes to a log file)."""

    def __init__(self, args: argparse.Namespace, log: Path, extra: list[str] | None = None,
                 env: dict[str, str] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        """``extra``: more flags (``--model`` is left out when they hold ``--models-dir``);
        ``env``: the server's environment; ``headers``: what the soak's own checks send."""
        self.port, self.log, self.env = free_port(), log, env
        extra = extra or []
        model = ["--model", args.model] if args.model and "--models-dir" not in extra else []
        self.cmd = [sys.executable, "-m", "llamapy.serve", "--host", "127.0.0.1", "--port",
                    str(self.port), "--n-ctx", str(args.n_ctx), "--n-parallel",
                    str(args.n_parallel), "--threads", str(args.threads),
                    "--prompt-cache-ram-mb", str(args.cache_ram_mb), "--embeddings",
                    "--log-level", "warning", *model, *extra]
        self.headers = headers or {}
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, timeout: float = 180.0) -> None:
        """Start (cwd: this checkout, so its ``llamapy`` is served) and wait for ``/health``."""
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *self.cmd, cwd=ROOT, stdout=out, stderr=out, env=self.env)
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(base_url=self.url, timeout=2) as client:
            while time.monotonic() < deadline:
                if self.proc.returncode is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode} "
                                       f"(log: {self.log})")
                try:
                    if (await client.get("/health")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError(f"server not healthy after {timeout:.0f} s (log: {self.log})")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def rss_mb(self) -> float | None:
        """The process's resident set now (``VmRSS``), MB."""
        if not self.alive or self.proc is None:
            return None
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return None
        kb = next((line.split()[1] for line in status.splitlines()
                   if line.startswith("VmRSS:")), None)
        return int(kb) / 1024 if kb else None

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), 20)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


async def send(client: httpx.AsyncClient, server: Server, req: Req,
               rng: random.Random) -> int | None:
    """Send ``req`` as its mode says; the answer's status (None: dropped before one came)."""
    headers = {"content-type": req.content_type, **dict(req.headers)}
    if req.mode == "hangup":
        return await hang_up(server.port, req, rng)
    if req.mode == "get":
        return (await client.get(req.path, headers=dict(req.headers))).status_code
    if req.mode == "post":
        resp = await client.post(req.path, content=req.content, headers=headers)
        return resp.status_code
    async with client.stream("POST", req.path, content=req.content, headers=headers) as resp:
        async for line in resp.aiter_lines():
            if req.mode == "cancel" and line.startswith("data: "):
                break  # leaving the block closes the stream
        return resp.status_code


async def hang_up(port: int, req: Req, rng: random.Random) -> int | None:
    """Send ``req`` on a raw socket and drop it: at once, or after the first bytes came back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (f"POST {req.path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: "
            f"{req.content_type}\r\nContent-Length: {len(req.content)}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in req.headers) + "\r\n")
    status = None
    try:
        writer.write(head.encode() + req.content)
        await writer.drain()
        if rng.random() < 0.7:
            first = await asyncio.wait_for(reader.read(64), CLIENT_TIMEOUT_S)
            status = int(first.split()[1]) if first.startswith(b"HTTP/") else None
    finally:
        writer.transport.abort()
    return status


async def one_request(client: httpx.AsyncClient, server: Server, tally: Tally, req: Req,
                      rng: random.Random, is_hostile: bool, up: asyncio.Event) -> None:
    """Send one request and count its outcome (and its latency, when valid and 2xx). A
    connection error or a 503 notes the suspects and pauses every worker until the monitor
    has checked the server."""
    token = tally.begin(req.kind) if is_hostile else None
    started = time.monotonic()
    status, error = None, None
    try:
        status = await asyncio.wait_for(send(client, server, req, rng), CLIENT_TIMEOUT_S)
    except (TimeoutError, httpx.TimeoutException):
        error = "timeout"
    except (httpx.TransportError, OSError):
        error = "connection error"
    except asyncio.CancelledError:  # the run stopped with this request in flight
        tally.count(req, "unfinished", time.monotonic() - started, is_hostile)
        raise
    finally:
        if error == "connection error" or status == 503:  # stopped, or not serving
            tally.mark_failure()
            up.clear()
        tally.end(token)
    tally.count(req, outcome(status, error), time.monotonic() - started, is_hostile)


async def worker(server: Server, tally: Tally, args: argparse.Namespace, seed: int,
                 deadline: float, up: asyncio.Event) -> None:
    """Requests one after another until ``deadline`` (pausing while ``up`` is clear)."""
    rng, bad = random.Random(seed), hostile_bodies(args.heavy)
    async with httpx.AsyncClient(base_url=server.url, timeout=CLIENT_TIMEOUT_S) as client:
        while time.monotonic() < deadline and not tally.stopped:
            try:
                await asyncio.wait_for(up.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return
            is_hostile = rng.random() < args.bad_rate
            req = rng.choice(bad) if is_hostile else valid(rng)
            await one_request(client, server, tally, req, rng, is_hostile, up)


async def health_once(client: httpx.AsyncClient) -> int | None:
    """``/health``'s status, or None when it did not answer in time."""
    try:
        return (await client.get("/health", timeout=10)).status_code
    except httpx.HTTPError:
        return None


async def monitor(server: Server, tally: Tally, args: argparse.Namespace, deadline: float,
                  up: asyncio.Event) -> None:
    """Every second: ``/health`` (and RSS every ``--rss-every`` s). A healthy server lets
    paused workers go on; a stopped one is recorded and restarted (``--restarts``) or ends
    the run."""
    strikes, next_rss = 0, 0.0
    async with httpx.AsyncClient(base_url=server.url) as client:
        while time.monotonic() < deadline and not tally.stopped:
            now = time.monotonic()
            if now >= next_rss and (rss := server.rss_mb()) is not None:
                tally.rss.append((now - tally.started, rss))
                next_rss = now + args.rss_every
            status = await health_once(client) if server.alive else None
            strikes = 0 if status == 200 else strikes + 1
            tally.health(status)
            if not server.alive or (status is not None and status != 200) \
                    or strikes >= HEALTH_STRIKES:
                tally.mark_failure()
                await on_stopped(server, tally, args, status, up)
                strikes = 0
            elif status == 200:
                tally.clear_failure()
                up.set()
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - now)))


async def on_stopped(server: Server, tally: Tally, args: argparse.Namespace,
                     status: int | None, up: asyncio.Event) -> None:
    """Record a stopped server; restart it if restarts are left, else stop the traffic."""
    code = server.proc.returncode if server.proc else None
    tally.deaths.append(Death(time.monotonic() - tally.started, code, status,
                              tally.failure_suspects or []))
    if len(tally.deaths) > args.restarts:
        tally.stopped = True
        up.set()  # let paused workers see the end
        return
    up.clear()
    await server.stop()
    await server.start()
    tally.restarts += 1
    tally.reset_suspects()
    up.set()


async def drained(server: Server, timeout: float = 60.0) -> bool:
    """Whether every slot is idle within ``timeout`` and a chat then answers 200."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=server.url, timeout=CLIENT_TIMEOUT_S,
                                 headers=server.headers) as client:
        try:
            while time.monotonic() < deadline:
                slots = (await client.get("/slots")).json()
                if all(not s.get("is_processing") for s in slots):
                    break
                await asyncio.sleep(0.5)
            else:
                return False
            chat = b'{"messages":[{"role":"user","content":"Say hi."}],"max_tokens":4}'
            resp = await client.post(CHAT, content=chat, headers={"content-type": JSON_TYPE})
            return resp.status_code == 200
        except (httpx.HTTPError, ValueError, AttributeError):
            return False


async def check_embeddings(server: Server) -> None:
    """Embeddings must be served (the mix sends them)."""
    async with httpx.AsyncClient(base_url=server.url, timeout=CLIENT_TIMEOUT_S,
                                 headers=server.headers) as client:
        resp = await client.post("/v1/embeddings", json={"input": "hello"})
    if resp.status_code != 200:
        raise RuntimeError(f"/v1/embeddings answered {resp.status_code}: embeddings are off")


async def soak(args: argparse.Namespace, log: Path) -> Tally:
    """Start the server, run the traffic and the monitor, drain, stop; the counts."""
    server = Server(args, log)
    await server.start()
    warmup = args.warmup_s if args.warmup_s is not None else min(60.0, args.minutes * 15)
    tally = Tally(time.monotonic(), warmup)
    try:
        await check_embeddings(server)
        up, deadline = asyncio.Event(), time.monotonic() + args.minutes * 60
        up.set()
        workers = [asyncio.create_task(worker(server, tally, args, args.seed * 1000 + i,
                                              deadline, up)) for i in range(args.workers)]
        await monitor(server, tally, args, deadline, up)
        if tally.stopped:  # requests on a stopped server would wait out their timeout
            for task in workers:
                task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        tally.alive_at_end = server.alive
        tally.drained = server.alive and await drained(server)
        if (rss := server.rss_mb()) is not None:
            tally.rss.append((time.monotonic() - tally.started, rss))
    finally:
        await server.stop()
    return tally


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--workers", type=int, default=4, help="concurrent clients")
    p.add_argument("--bad-rate", type=float, default=0.1, help="share of hostile requests")
    p.add_argument("--model", default=None, help="GGUF to serve (default: the default model)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--n-parallel", type=int, default=4)
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cache-ram-mb", type=float, default=64.0,
                   help="the server's RAM prompt cache (bounded, so RSS can level off)")
    p.add_argument("--rss-every", type=float, default=5.0, help="seconds between RSS samples")
    p.add_argument("--warmup-s", type=float, default=None,
                   help="RSS growth and slope are measured after this many seconds "
                        "(default: a quarter of the run, at most 60)")
    p.add_argument("--max-rss-growth-mb", type=float, default=100.0)
    p.add_argument("--restarts", type=int, default=0,
                   help="restart a stopped server up to this many times (to find more culprits)")
    p.add_argument("--heavy", action="store_true",
                   help="also send bodies that may allocate gigabytes on an unfixed server")
    p.add_argument("--log", type=Path, default=Path("/tmp/llamapy-soak-server.log"))
    t = p.add_argument_group("two tenants (soak_tenants.py)")
    t.add_argument("--tenants", action="store_true",
                   help="a good tenant (1 client) beside a bad one (the other workers)")
    t.add_argument("--solo-seconds", type=float, default=60.0,
                   help="the good tenant alone first, for its solo latency")
    t.add_argument("--no-pull-on-demand", dest="pull_on_demand", action="store_false",
                   help="serve --model alone (default: --models-dir with --pull-on-demand)")
    t.add_argument("--tenant-max-slots", type=int, default=None,
                   help="the server's bound of slots per tenant (default: n_parallel - 1)")
    t.add_argument("--classic-hostile", action="store_true",
                   help="the bad tenant also sends soak_inputs' hostile bodies")
    t.add_argument("--strict", action="store_true",
                   help="fail on hostile answers not expected, too")
    return p.parse_args(argv)


def log_clues(log: Path) -> list[str]:
    """What the server's log says about how it stopped: C++ exceptions and Python errors,
    each once with its count."""
    clues: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith(("terminate called", "  what():", "Exception in thread")) or \
                re.match(r"^[A-Za-z_.]*(Error|Exception): ", line):
            clues[line.strip()] = clues.get(line.strip(), 0) + 1
    return [f"- `{line}`" + (f" (x{n})" if n > 1 else "") for line, n in clues.items()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.log.write_bytes(b"")
    if args.tenants:
        from soak_tenants import main_tenants

        return main_tenants(args)
    tally = asyncio.run(soak(args, args.log))
    text, ok = report(tally, args)
    print(text)
    if not ok:
        print("\nThe server's log:", *log_clues(args.log), f"(all of it: {args.log})",
              sep="\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
