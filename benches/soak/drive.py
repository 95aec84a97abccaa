#!/usr/bin/env python3
"""The soak's load: a bounded mix of traffic and faults against one running slotgate.

Started by benches/soak/run.sh, which owns the processes; this script only talks HTTP to the
gateway on loopback and sends signals to the two pids it is given. Standard library only.

For SECONDS seconds it runs, side by side:

- streamers: streamed chat completions read to their end;
- cancellers: streams dropped after their first event (the client goes away mid-stream);
- a queue filler: bursts at a model with one slot and a short queue_timeout, so requests queue
  and some time out with 503;
- a reloader: rewrites the config (another queue size) and sends SIGHUP;
- one upstream restart: the fake engine is killed and started again half-way;
- slowloris batches: connections that send half a request head, a byte at a time, and are cut
  by header_read_timeout;
- engine 500s: every few seconds three concurrent requests that the engine answers with 500,
  then one ordinary request, which must be served (the only upstream is never ejected for it);
- idle floods: every so often more idle connections than the listener's max_connections (HTTP/2
  prefaces with an empty SETTINGS, and silent TCP) on the API listener and more than
  admin_max_connections on the admin one; a new chat request and a `/healthz` are timed while
  the flood holds (a lock-out is either one taking 1 s or more).

Each worker stops at the deadline; every socket has a timeout, so nothing waits past it by more
than one socket timeout. It prints one JSON line of counts at the end.
"""

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import time

COUNTS = collections.Counter()
# Until when the engine is down or just back (set by the restarter): the engine-500 bursts and
# the flood's timed requests wait for it, since their checks are about the gateway.
ENGINE_BACK_AT = [0.0]


async def engine_up():
    while time.monotonic() < ENGINE_BACK_AT[0]:
        await asyncio.sleep(0.5)
SOCKET_TIMEOUT = 30.0


def chat_body(model, stream, tokens):
    return json.dumps(
        {
            "model": model,
            "stream": stream,
            "messages": [{"role": "user", "content": "soak"}],
            "max_tokens": tokens,
        }
    ).encode()


def request_bytes(port, model, stream, tokens, extra=""):
    body = chat_body(model, stream, tokens)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\n{extra}\r\n"
    )
    return head.encode() + body


async def exchange(port, data, read_all=True, first_bytes=0):
    """Sends one request on a fresh connection; returns the status (0 on a failure)."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port), SOCKET_TIMEOUT
    )
    try:
        writer.write(data)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), SOCKET_TIMEOUT)
        parts = line.split()
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if read_all:
            while await asyncio.wait_for(reader.read(65536), SOCKET_TIMEOUT):
                pass
        elif first_bytes:
            await asyncio.wait_for(reader.read(first_bytes), SOCKET_TIMEOUT)
        return status
    finally:
        writer.close()


async def streams(args, deadline, kind):
    """Streams read to their end (`stream`), or dropped after their first bytes (`cancel`)."""
    tokens, read_all = (20, True) if kind == "stream" else (500, False)
    data = request_bytes(args.port, "m", True, tokens, "x-fake-chunk-interval-ms: 20\r\n")
    while time.monotonic() < deadline:
        try:
            status = await exchange(args.port, data, read_all=read_all, first_bytes=512)
            COUNTS[f"{kind}_{status}"] += 1
        except (OSError, asyncio.TimeoutError) as error:
            COUNTS[f"{kind}_error_{type(error).__name__}"] += 1
            await asyncio.sleep(0.2)
        if kind == "cancel":
            await asyncio.sleep(0.1)


async def queue_filler(args, deadline):
    """Bursts of 6 at model `tight` (1 slot, queue 3, queue_timeout 500 ms), each held 800 ms."""
    data = request_bytes(args.port, "tight", False, 4, "x-fake-hold-ms: 800\r\n")

    async def one():
        try:
            status = await exchange(args.port, data)
            COUNTS[f"queue_{status}"] += 1
        except (OSError, asyncio.TimeoutError) as error:
            COUNTS[f"queue_error_{type(error).__name__}"] += 1

    while time.monotonic() < deadline:
        await asyncio.gather(*(one() for _ in range(6)))
        await asyncio.sleep(0.5)


async def reloader(args, deadline):
    if args.reload_every <= 0:
        return
    queue = 64
    while True:
        await asyncio.sleep(args.reload_every)
        if time.monotonic() >= deadline:
            return
        queue = 65 if queue == 64 else 64
        with open(args.config, encoding="utf-8") as f:
            text = f.read()
        text = text.replace(f"queue = {129 - queue}\n", f"queue = {queue}\n", 1)
        with open(args.config, "w", encoding="utf-8") as f:
            f.write(text)
        os.kill(args.gateway_pid, signal.SIGHUP)
        COUNTS["reloads"] += 1


async def restarter(args, deadline, start):
    """Kills the fake engine half-way and starts it again on the same port."""
    if args.no_restart:
        return
    await asyncio.sleep(max(0.0, (deadline - start) / 2))
    if time.monotonic() >= deadline:
        return
    pid = int(open(args.fake_pidfile, encoding="utf-8").read())
    # Down 3 s, then health checks every 1 s restore it: 10 s is ample.
    ENGINE_BACK_AT[0] = time.monotonic() + 10.0
    os.kill(pid, signal.SIGKILL)
    COUNTS["upstream_killed"] += 1
    await asyncio.sleep(3)
    proc = subprocess.Popen(  # pylint: disable=consider-using-with
        args.fake_cmd.split(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with open(args.fake_pidfile, "w", encoding="utf-8") as f:
        f.write(str(proc.pid))
    COUNTS["upstream_restarted"] += 1


async def slowloris(args, deadline):
    """Every `slowloris_every` seconds, 50 connections trickle a head that never ends."""

    async def one():
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", args.port), SOCKET_TIMEOUT
            )
        except (OSError, asyncio.TimeoutError):
            COUNTS["slowloris_connect_failed"] += 1
            return
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "
        try:
            for i in range(120):
                writer.write(head[i : i + 1] if i < len(head) else b"a")
                await writer.drain()
                try:
                    got = await asyncio.wait_for(reader.read(1), 1.0)
                    if not got:
                        COUNTS["slowloris_cut"] += 1
                        return
                except asyncio.TimeoutError:
                    pass
            COUNTS["slowloris_not_cut"] += 1
        except OSError:
            COUNTS["slowloris_cut"] += 1
        finally:
            writer.close()

    if args.slowloris_every <= 0:
        return
    warm_until = time.monotonic() + args.warmup
    while time.monotonic() < deadline:
        await asyncio.gather(*(one() for _ in range(50)))
        COUNTS["slowloris_batches"] += 1
        # Batches come every 10 s during the warm-up: each one makes the gateway's allocator
        # hold more of the memory of 50 connections at once, until it holds enough (a few
        # batches); the warm-up's RSS then already includes that, as it includes the rest of
        # the load (docs/benchmarks.md, "Soak").
        warm = time.monotonic() < warm_until
        await asyncio.sleep(min(10.0, args.slowloris_every) if warm else args.slowloris_every)


async def engine_errors(args, deadline):
    """Every `errors_every` seconds, three concurrent requests the engine answers 500, then one
    ordinary request (`after500_<status>`: anything but 200 means the burst cut service)."""
    if args.errors_every <= 0:
        return
    fail = request_bytes(args.port, "m", False, 4, "x-fake-fail: status-500\r\n")
    ok = request_bytes(args.port, "m", False, 4)

    async def one(data, kind):
        try:
            status = await exchange(args.port, data)
            COUNTS[f"{kind}_{status}"] += 1
        except (OSError, asyncio.TimeoutError) as error:
            COUNTS[f"{kind}_error_{type(error).__name__}"] += 1

    while time.monotonic() < deadline:
        await engine_up()
        await asyncio.gather(*(one(fail, "engine500") for _ in range(3)))
        await one(ok, "after500")
        await asyncio.sleep(args.errors_every)


H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


async def timed(port, data):
    """(status, seconds) of one request on a fresh connection."""
    started = time.monotonic()
    try:
        status = await exchange(port, data)
    except (OSError, asyncio.TimeoutError):
        status = 0
    return status, time.monotonic() - started


async def idle_flood(args, deadline):
    """Every `flood_every` seconds, `flood_count` idle connections on the API listener and
    `admin_flood_count` on the admin one (HTTP/2 hellos and silent TCP, alternately), held
    `FLOOD_HOLD` seconds; a chat request and a `/healthz` are timed twice while it holds."""
    if args.flood_every <= 0 or not args.admin_port:
        return
    chat = request_bytes(args.port, "m", False, 4)
    healthz = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{args.admin_port}\r\n" \
              "Connection: close\r\n\r\n".encode()
    hello = H2_HELLO
    await asyncio.sleep(min(args.flood_every, 15.0))
    while time.monotonic() < deadline:
        await engine_up()
        flood = []
        for port, count in ((args.port, args.flood_count), (args.admin_port, args.admin_flood_count)):
            for _ in range(count):
                try:
                    _, writer = await asyncio.wait_for(
                        asyncio.open_connection("127.0.0.1", port), SOCKET_TIMEOUT
                    )
                    if hello:
                        writer.write(hello)
                    flood.append(writer)
                except (OSError, asyncio.TimeoutError):
                    COUNTS["flood_connect_failed"] += 1
        COUNTS["flood_h2" if hello else "flood_tcp"] += 1
        for _ in range(2):
            for port, data, kind in ((args.port, chat, "chat"), (args.admin_port, healthz, "healthz")):
                status, seconds = await timed(port, data)
                COUNTS[f"flood_{kind}_{status}"] += 1
                if seconds >= 1.0:
                    COUNTS[f"flood_{kind}_lockout"] += 1
                key = f"flood_{kind}_max_ms"
                COUNTS[key] = max(COUNTS[key], round(seconds * 1000))
            await asyncio.sleep(0.5)
        await asyncio.sleep(FLOOD_HOLD)
        for writer in flood:
            writer.close()
        hello = b"" if hello else H2_HELLO
        await asyncio.sleep(args.flood_every)


FLOOD_HOLD = 2.0


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--gateway-pid", type=int, required=True)
    parser.add_argument("--fake-pidfile", required=True)
    parser.add_argument("--fake-cmd", required=True)
    # 0 switches the part off (to tell which part memory grows with).
    parser.add_argument("--reload-every", type=float, default=20.0)
    parser.add_argument("--slowloris-every", type=float, default=60.0)
    parser.add_argument("--no-restart", action="store_true")
    parser.add_argument("--warmup", type=float, default=0.0)
    parser.add_argument("--errors-every", type=float, default=5.0)
    parser.add_argument("--admin-port", type=int, default=0)
    parser.add_argument("--flood-every", type=float, default=30.0)
    parser.add_argument("--flood-count", type=int, default=300)
    parser.add_argument("--admin-flood-count", type=int, default=80)
    args = parser.parse_args()

    start = time.monotonic()
    deadline = start + args.seconds
    workers = [streams(args, deadline, "stream") for _ in range(4)]
    workers += [streams(args, deadline, "cancel") for _ in range(2)]
    workers += [
        queue_filler(args, deadline),
        reloader(args, deadline),
        restarter(args, deadline, start),
        slowloris(args, deadline),
        engine_errors(args, deadline),
        idle_flood(args, deadline),
    ]
    await asyncio.gather(*workers)
    print(json.dumps(dict(sorted(COUNTS.items()))))


if __name__ == "__main__":
    asyncio.run(main())
