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
  by header_read_timeout.

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
    ]
    await asyncio.gather(*workers)
    print(json.dumps(dict(sorted(COUNTS.items()))))


if __name__ == "__main__":
    asyncio.run(main())
