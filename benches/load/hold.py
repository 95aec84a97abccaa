#!/usr/bin/env python3
"""Holds N streamed chat completions open through a proxy, for the RSS-per-stream figure.

Opens N HTTP/1.1 connections to 127.0.0.1:PORT (at most --ramp connecting at once), sends each a
streamed chat completion, waits for the response head and the first bytes of the body, then keeps
every connection open without reading further until stdin closes. Prints "ready N" once all N are
streaming (or "failed K" and exits 1 if any connection was refused or errored). Standard library
only.
"""
import argparse
import asyncio
import sys

BODY = b'{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]}'


async def one(port: int, gate: asyncio.Semaphore, held: list) -> bool:
    async with gate:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n"
                b"Content-Type: application/json\r\nContent-Length: "
                + str(len(BODY)).encode()
                + b"\r\n\r\n"
                + BODY
            )
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
            if not head.startswith(b"HTTP/1.1 200"):
                print(head.split(b"\r\n", 1)[0].decode(errors="replace"), file=sys.stderr)
                return False
            await asyncio.wait_for(reader.read(1), 60)
            held.append((reader, writer))
            return True
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as error:
            print(f"{type(error).__name__}: {error}", file=sys.stderr)
            return False


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--ramp", type=int, default=256)
    args = parser.parse_args()
    gate = asyncio.Semaphore(args.ramp)
    held: list = []
    results = await asyncio.gather(*(one(args.port, gate, held) for _ in range(args.count)))
    failed = results.count(False)
    if failed:
        print(f"failed {failed}", flush=True)
        return 1
    print(f"ready {len(held)}", flush=True)
    # Hold until the caller closes our stdin.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for _, writer in held:
        writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
