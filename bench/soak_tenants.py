"""``bench/soak.py --tenants``: a well-behaved tenant's latency while another tenant mixes
hostile requests into its traffic.

The server gets an ``--api-key-file`` of three keys (``sk-good good``, ``sk-bad bad``,
``sk-admin - admin``: the soak's own checks use the admin key), ``--slot-save-path`` and
``--tenant-max-slots`` (``n_parallel - 1`` unless given), all in a temporary folder. By default
it serves the model from a ``--models-dir`` (a link to the GGUF) with ``--pull-on-demand``, so
the pull requests meet the Hub code and ``keep_alive`` can unload a model;
``--no-pull-on-demand`` serves ``--model`` alone. ``HF_ENDPOINT`` points at a loopback trap
that counts connections (any is a failure: no request may reach the Hub) and the proxy
variables are dropped, so the run is hermetic.

After one warm-up request per prompt, the good tenant runs alone for ``--solo-seconds`` (its
solo latency), then for ``--minutes`` beside the bad tenant's ``--workers - 1`` clients: the
valid mix of ``soak_inputs`` and, at ``--bad-rate``, the hostile classes of
``soak_tenant_inputs`` (``--classic-hostile`` adds ``soak_inputs``' bodies). The monitor
(``/health`` every second, RSS), the restarts and the drain are ``soak.py``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import tempfile
import time
from pathlib import Path

import httpx
from soak import (
    CLIENT_TIMEOUT_S,
    Server,
    check_embeddings,
    drained,
    log_clues,
    monitor,
    one_request,
    send,
)
from soak_inputs import Req, hostile_bodies, valid
from soak_report import Tally, outcome
from soak_tenant_inputs import Hostile, as_hostile, good_chats, tenant_hostile, with_key
from soak_tenant_report import TenantTally, tenant_report

KEYS = {"good": "sk-good", "bad": "sk-bad", "admin": "sk-admin"}
KEY_FILE = "sk-good good\nsk-bad bad\nsk-admin - admin\n"
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
              "ALL_PROXY")


class HubTrap:
    """A loopback listener standing in for the Hub: it records each connection's first line
    and answers 404."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            self.hits.append(line.decode(errors="replace").strip() or "(no request line)")
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n"
                         b"Connection: close\r\n\r\n")
            await writer.drain()
        except (TimeoutError, OSError):
            self.hits.append("(connection, no request line)")
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def model_path(args: argparse.Namespace) -> Path:
    from llamapy.models import default_model_path

    return Path(args.model) if args.model else default_model_path()


def server_for(args: argparse.Namespace, log: Path, tmp: Path, hub_url: str) -> Server:
    """The server with two tenants and an admin, slot files, and (by default) the router."""
    (tmp / "keys").write_text(KEY_FILE)
    (tmp / "slots").mkdir()
    max_slots = args.tenant_max_slots if args.tenant_max_slots is not None \
        else max(0, args.n_parallel - 1)
    extra = ["--api-key-file", str(tmp / "keys"), "--slot-save-path", str(tmp / "slots"),
             "--tenant-max-slots", str(max_slots)]
    args.tenant_max_slots = max_slots
    if args.pull_on_demand:
        (tmp / "models").mkdir()
        gguf = model_path(args).resolve()
        (tmp / "models" / gguf.name).symlink_to(gguf)
        extra += ["--models-dir", str(tmp / "models"), "--pull-on-demand"]
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARS}
    env |= {"HF_ENDPOINT": hub_url, "HF_HOME": str(tmp / "hf"), "NO_PROXY": "*"}
    return Server(args, log, extra, env, {"Authorization": f"Bearer {KEYS['admin']}"})


async def served_name(server: Server) -> str:
    """The name of the model served (what the tenants' requests send)."""
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers,
                                 timeout=CLIENT_TIMEOUT_S) as client:
        resp = await client.get("/v1/models")
    resp.raise_for_status()
    return str(resp.json()["data"][0]["id"])


async def warm_up(server: Server, model: str) -> None:
    """Each good prompt once (the model loads, the prompts are cached), and embeddings."""
    reqs = good_chats(model, KEYS["good"])
    async with httpx.AsyncClient(base_url=server.url, timeout=CLIENT_TIMEOUT_S) as client:
        for req in itertools.islice(reqs, 4):
            status = await send(client, server, req, random.Random(0))
            if status != 200:
                raise RuntimeError(f"the good tenant's warm-up chat answered {status}")
    await check_embeddings(server)


async def good_worker(server: Server, tt: TenantTally, model: str, deadline: float,
                      up: asyncio.Event) -> None:
    """The good tenant: one chat after another until ``deadline``; each counted in the
    phase it started in."""
    tally, reqs, rng = tt.tally, good_chats(model, KEYS["good"]), random.Random(0)
    async with httpx.AsyncClient(base_url=server.url, timeout=CLIENT_TIMEOUT_S) as client:
        while time.monotonic() < deadline and not tally.stopped:
            try:
                await asyncio.wait_for(up.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return
            started = time.monotonic()
            status, error = None, None
            try:
                status = await asyncio.wait_for(send(client, server, next(reqs), rng),
                                                CLIENT_TIMEOUT_S)
            except (TimeoutError, httpx.TimeoutException):
                error = "timeout"
            except (httpx.TransportError, OSError):
                error = "connection error"
            if error == "connection error" or status == 503:
                tally.mark_failure()
                up.clear()
            at = started - tally.started
            tt.good_done("solo" if at < tt.solo_end_s else "mix", outcome(status, error), at,
                         time.monotonic() - started)


async def pick_slot(client: httpx.AsyncClient, rng: random.Random, theirs: bool) -> int:
    """A slot as the bad tenant's ``/slots`` shows it: one the other tenant holds (busy ones
    first), or one of its own (idle ones first); slot 0 when it shows none."""
    try:
        slots = (await client.get("/slots")).json()
        pick = [s for s in slots if bool(s.get("other_tenant")) == theirs]
        first = [s for s in pick if bool(s.get("is_processing")) == theirs]
        return int(rng.choice(first or pick)["id"]) if pick else 0
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return 0


def hostile_pool(args: argparse.Namespace, model: str) -> list[Hostile]:
    """The bad tenant's hostile requests (with ``--classic-hostile``, soak_inputs' too)."""
    pool = tenant_hostile(model, KEYS["bad"])
    if args.classic_hostile:
        any_answer = frozenset({"2xx", "4xx"})
        pool += [as_hostile(with_key(r, KEYS["bad"]), "classic", any_answer)
                 for r in hostile_bodies(args.heavy)]
    return pool


async def bad_worker(server: Server, tt: TenantTally, args: argparse.Namespace, seed: int,
                     pool: list[Hostile], counter: itertools.count[int], deadline: float,
                     up: asyncio.Event) -> None:
    """A bad tenant's client, from the end of the solo phase until ``deadline``."""
    rng, tally = random.Random(seed), tt.tally
    await asyncio.sleep(max(0.0, tally.started + tt.solo_end_s - time.monotonic()))
    async with httpx.AsyncClient(base_url=server.url, timeout=CLIENT_TIMEOUT_S,
                                 headers={"Authorization": f"Bearer {KEYS['bad']}"}) as client:
        while time.monotonic() < deadline and not tally.stopped:
            try:
                await asyncio.wait_for(up.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return
            is_hostile = rng.random() < args.bad_rate
            if is_hostile:
                h = rng.choice(pool)
                slot = await pick_slot(client, rng, h.klass == "id_slot") \
                    if h.klass in ("id_slot", "slot file") else 0
                req: Req = h.build(next(counter), slot)
            else:
                req = with_key(valid(rng), KEYS["bad"])
            started = time.monotonic()
            await one_request(client, server, tally, req, rng, is_hostile, up)
            if is_hostile:
                tt.hostile_lat[req.kind].append(time.monotonic() - started)
                tt.hostile_spans.append((started - tally.started,
                                         time.monotonic() - tally.started, req.kind))


def slot_files(folder: Path) -> tuple[int, int]:
    """How many slot files lie under ``folder``, and their bytes."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


async def traffic(server: Server, tt: TenantTally, args: argparse.Namespace, model: str,
                  pool: list[Hostile]) -> None:
    """Both phases, with the monitor; then the drain."""
    tally = tt.tally
    up, deadline = asyncio.Event(), tally.started + args.solo_seconds + args.minutes * 60
    up.set()
    counter = itertools.count(1)
    tasks = [asyncio.create_task(good_worker(server, tt, model, deadline, up))]
    tasks += [asyncio.create_task(bad_worker(server, tt, args, args.seed * 1000 + i, pool,
                                             counter, deadline, up))
              for i in range(max(1, args.workers - 1))]
    await monitor(server, tally, args, deadline, up)
    if tally.stopped:
        for task in tasks:
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    tally.alive_at_end = server.alive
    tally.drained = server.alive and await drained(server)
    if (rss := server.rss_mb()) is not None:
        tally.rss.append((time.monotonic() - tally.started, rss))


async def soak_tenants(args: argparse.Namespace, log: Path, tmp: Path
                       ) -> tuple[TenantTally, list[Hostile]]:
    """Start the trap and the server, warm up, run both phases, stop; the counts."""
    trap = HubTrap()
    server = server_for(args, log, tmp, await trap.start())
    try:
        await server.start()
        model = await served_name(server)
        await warm_up(server, model)
        pool = hostile_pool(args, model)
        warmup = args.warmup_s if args.warmup_s is not None else \
            args.solo_seconds + min(60.0, args.minutes * 15)
        tt = TenantTally(Tally(time.monotonic(), warmup), args.solo_seconds)
        await traffic(server, tt, args, model, pool)
    finally:
        await server.stop()
        await trap.stop()
    tt.hub_hits = trap.hits
    tt.slot_files = slot_files(tmp / "slots")
    return tt, pool


def main_tenants(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="llamapy-soak-") as tmp:
        tt, pool = asyncio.run(soak_tenants(args, args.log, Path(tmp)))
    text, ok = tenant_report(tt, pool, args)
    print(text)
    if not ok:
        print("\nThe server's log:", *log_clues(args.log), f"(all of it: {args.log})",
              sep="\n")
    return 0 if ok else 1
