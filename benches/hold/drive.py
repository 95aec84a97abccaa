#!/usr/bin/env python3
"""Measures what issue 28 asked the gateway to hold (driven by benches/hold/run.sh).

Scenarios, each printing one line of JSON:

  flood    idle connections (an HTTP/2 preface and an empty SETTINGS, or silent TCP) are opened
           on a listener, then a new client's request is timed: a chat completion on the API
           listener, `/healthz` on the admin listener.
  errors   three concurrent requests make the only engine answer 500; the next requests are
           counted by status.
  bodies   uploads with and without Content-Length fill the body budget while queued behind a
           held slot; the gateway's resident memory is sampled at its peak and afterwards.

Loopback only; every connection it opens is closed before it returns.
"""

import argparse
import http.client
import json
import socket
import threading
import time

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def chat_body(model, extra=""):
    return json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi" + extra}]}
    ).encode()


def request(port, method, path, body=None, headers=None, timeout=30):
    """One request on a new connection; returns (status, seconds)."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    finally:
        conn.close()


def open_idle(port, count, hello):
    """Opens `count` connections that send `hello` and then nothing."""
    flood = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        if hello:
            sock.sendall(hello)
        flood.append(sock)
    return flood


def flood(args):
    hello = H2_PREFACE if args.kind == "h2" else b""
    api = open_idle(args.api, args.api_count, hello)
    admin = open_idle(args.admin, args.admin_count, hello)
    time.sleep(0.5)
    chats = [request(args.api, "POST", "/v1/chat/completions", chat_body("m"),
                     {"content-type": "application/json"}) for _ in range(args.tries)]
    probes = [request(args.admin, "GET", "/healthz") for _ in range(args.tries)]
    # Which of the flood the gateway closed.
    closed = 0
    for sock in api + admin:
        sock.setblocking(False)
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    closed += 1
                    break
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        sock.close()
    print(json.dumps({
        "scenario": "flood", "kind": args.kind,
        "api_idle": len(api), "admin_idle": len(admin), "flood_closed": closed,
        "chat": [[s, round(t, 3)] for s, t in chats],
        "healthz": [[s, round(t, 3)] for s, t in probes],
    }))


def errors(args):
    fail = {"content-type": "application/json",
            "x-fake-fail": "slow-first-byte-ms=300,status-500"}
    results = [None] * 3

    def one(i):
        results[i] = request(args.api, "POST", "/v1/chat/completions", chat_body("m"), fail)[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = {}
    started = time.monotonic()
    while time.monotonic() - started < args.seconds:
        status, _ = request(args.api, "POST", "/v1/chat/completions", chat_body("m"),
                            {"content-type": "application/json"})
        after[status] = after.get(status, 0) + 1
        time.sleep(0.1)
    print(json.dumps({"scenario": "errors", "concurrent_500s": results,
                      "next_requests_by_status": after}))


def rss_kib(pid, field):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def upload(port, size, chunked, results, i):
    head = b'{"model":"m","messages":[{"role":"user","content":"'
    body = head + b"x" * (size - len(head) - 4) + b'"}]}'
    headers = {"content-type": "application/json", "x-fake-hold-ms": "0"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        if chunked:
            piece = 64 * 1024
            parts = (body[i:i + piece] for i in range(0, len(body), piece))
            conn.request("POST", "/v1/chat/completions", body=parts, headers=headers,
                         encode_chunked=True)
        else:
            conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        results[i] = response.status
    except OSError as error:
        results[i] = str(error)
    finally:
        conn.close()


def bodies(args):
    # One request holds the only slot; the uploads queue behind it with their bodies buffered.
    holder = threading.Thread(target=request, args=(
        args.api, "POST", "/v1/chat/completions", chat_body("m"),
        {"content-type": "application/json", "x-fake-hold-ms": str(args.hold_ms)}, 120))
    holder.start()
    time.sleep(0.5)
    before = rss_kib(args.gateway_pid, "VmRSS")
    results = [None] * args.uploads
    threads = [threading.Thread(target=upload, args=(args.api, args.size, args.chunked, results, i))
               for i in range(args.uploads)]
    for t in threads:
        t.start()
    peak = 0
    while any(t.is_alive() for t in threads) or holder.is_alive():
        peak = max(peak, rss_kib(args.gateway_pid, "VmRSS"))
        time.sleep(0.05)
    for t in threads:
        t.join()
    holder.join()
    time.sleep(1)
    statuses = {}
    for status in results:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    print(json.dumps({
        "scenario": "bodies", "chunked": args.chunked, "uploads": args.uploads,
        "size_mib": round(args.size / 2**20, 1), "statuses": statuses,
        "rss_mib_before": round(before / 1024), "rss_mib_peak": round(peak / 1024),
        "rss_mib_after": round(rss_kib(args.gateway_pid, "VmRSS") / 1024),
    }))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="scenario", required=True)
    f = sub.add_parser("flood")
    f.add_argument("--api", type=int, required=True)
    f.add_argument("--admin", type=int, required=True)
    f.add_argument("--kind", choices=["h2", "tcp"], default="h2")
    f.add_argument("--api-count", type=int, default=1100)
    f.add_argument("--admin-count", type=int, default=100)
    f.add_argument("--tries", type=int, default=5)
    e = sub.add_parser("errors")
    e.add_argument("--api", type=int, required=True)
    e.add_argument("--seconds", type=float, default=3.0)
    b = sub.add_parser("bodies")
    b.add_argument("--api", type=int, required=True)
    b.add_argument("--gateway-pid", type=int, required=True)
    b.add_argument("--uploads", type=int, default=12)
    b.add_argument("--size", type=int, default=30 * 2**20)
    b.add_argument("--chunked", action="store_true")
    b.add_argument("--hold-ms", type=int, default=8000)
    args = parser.parse_args()
    {"flood": flood, "errors": errors, "bodies": bodies}[args.scenario](args)


if __name__ == "__main__":
    main()
