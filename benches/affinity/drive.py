#!/usr/bin/env python3
"""Multi-turn chat conversations at once, for the cache-affinity benchmark (benches/affinity).

Each conversation sends TURNS streamed chat requests one after another, each resending the
whole conversation so far (a long system prompt, then the user and assistant turns), with a
short pause between turns, as a chat UI or a coding agent does. All conversations start at the
same moment. Per request it records the time to the first event, the whole time, and the
engine's own report of the prompt tokens and of those it found in its cache
(`usage.prompt_tokens_details.cached_tokens`, else `timings.cache_n`).

    drive.py --url http://127.0.0.1:8080 --model bench --out result.json
    drive.py --pinned URL0 URL1 URL2 ...    # conversation i talks to URL[i % n] directly

The system prompts are calibrated to --system-tokens tokens with the engine's own /tokenize
(--tokenize-url, a llama-server). With --shared every conversation has the same system prompt;
otherwise each has its own, different from its first word. Python standard library only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse
import urllib.request

WORDS = (
    "time person year way day thing man world life hand part child eye woman place work week "
    "case point government company number group problem fact river stone window garden letter "
    "market engine signal harbour forest matter question answer morning evening island bridge"
).split()


def tokenize(url: str, text: str) -> int:
    """The engine's token count of `text`."""
    body = json.dumps({"content": text}).encode()
    req = urllib.request.Request(url + "/tokenize", body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return len(json.load(resp)["tokens"])


def system_prompt(seed: int, tokens: int, tokenize_url: str) -> str:
    """A deterministic text of about `tokens` tokens that differs from its first word per seed."""
    rng = random.Random(seed)
    words = [f"Assistant{seed} briefing."]
    while True:
        words.extend(f"{rng.choice(WORDS)}{rng.randint(0, 999)}" for _ in range(200))
        n = tokenize(tokenize_url, " ".join(words))
        if n >= tokens:
            break
    # Trim to the target (a word is a few tokens; close is enough).
    while len(words) > 1 and tokenize(tokenize_url, " ".join(words[:-10])) >= tokens:
        words = words[:-10]
    return " ".join(words)


def question(conversation: int, turn: int) -> str:
    rng = random.Random(conversation * 100 + turn)
    return f"Turn {turn}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 24))) + "?"


def stream_chat(url: str, body: dict, timeout: float) -> dict:
    """One streamed chat request: times, text, usage as the engine reported it."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    payload = json.dumps(body).encode()
    started = time.monotonic()
    first = None
    text = []
    usage = None
    timings = None
    status = 0
    try:
        conn.request("POST", parts.path.rstrip("/") + "/v1/chat/completions", payload,
                     {"content-type": "application/json", "accept": "text/event-stream"})
        resp = conn.getresponse()
        status = resp.status
        if status != 200:
            return {"status": status, "error": resp.read(2000).decode("utf-8", "replace"),
                    "total": time.monotonic() - started}
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            if first is None:
                first = time.monotonic() - started
            data = line[5:].strip()
            if data == "[DONE]":
                # Read on to the end of the body, as a client library does.
                continue
            chunk = json.loads(data)
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    text.append(piece)
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk.get("timings"):
                timings = chunk["timings"]
    except (OSError, http.client.HTTPException, ValueError) as e:
        return {"status": status, "error": repr(e), "total": time.monotonic() - started}
    finally:
        conn.close()
    prompt = cached = None
    if usage:
        prompt = usage.get("prompt_tokens")
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None and timings:
        cached = timings.get("cache_n")
    return {"status": status, "ttft": first, "total": time.monotonic() - started,
            "text": "".join(text), "prompt_tokens": prompt, "cached_tokens": cached}


def conversation(i: int, args, system: str, url: str, start: threading.Event, out: list) -> None:
    messages = [{"role": "system", "content": system}]
    start.wait()
    for turn in range(args.turns):
        messages.append({"role": "user", "content": question(i, turn)})
        body = {"model": args.model, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, "max_tokens": args.max_tokens,
                "temperature": 0}
        sent = time.monotonic()
        # A failed turn is sent again, as the OpenAI SDKs do (2 retries by default, for
        # connection errors, 408, 409, 429 and 5xx); the times are the successful attempt's.
        for attempt in range(args.retries + 1):
            result = stream_chat(url, body, args.timeout)
            if result.get("status") == 200:
                break
            print(f"conversation {i} turn {turn} attempt {attempt}: {result.get('status')} "
                  f"{result.get('error')}", file=sys.stderr)
            time.sleep(0.5)
        result.update(conversation=i, turn=turn, sent=sent, retries=attempt)
        out.append(result)
        if result.get("status") != 200:
            return
        messages.append({"role": "assistant", "content": result["text"]})
        if turn + 1 < args.turns:
            time.sleep(args.think)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    target = ap.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="one base URL for every conversation (a gateway)")
    target.add_argument("--pinned", nargs="+", help="engine URLs; conversation i uses i %% n")
    ap.add_argument("--tokenize-url", required=True, help="a llama-server, for /tokenize")
    ap.add_argument("--model", default="bench")
    ap.add_argument("--conversations", type=int, default=9)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--think", type=float, default=0.3, help="seconds between turns")
    ap.add_argument("--system-tokens", type=int, default=2600)
    ap.add_argument("--shared", action="store_true", help="one system prompt for all")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    ap.add_argument("--retries", type=int, default=2, help="attempts after a failed turn")
    ap.add_argument("--out", required=True, help="where to write the JSON result")
    args = ap.parse_args()

    seeds = [0] * args.conversations if args.shared else list(range(args.conversations))
    prompts = {seed: system_prompt(seed, args.system_tokens, args.tokenize_url)
               for seed in set(seeds)}
    urls = [args.url] * args.conversations if args.url else [
        args.pinned[i % len(args.pinned)] for i in range(args.conversations)]
    results: list = []
    start = threading.Event()
    threads = [threading.Thread(target=conversation,
                                args=(i, args, prompts[seeds[i]], urls[i], start, results))
               for i in range(args.conversations)]
    for t in threads:
        t.start()
    began = time.monotonic()
    start.set()
    for t in threads:
        t.join()
    wall = time.monotonic() - began
    with open(args.out, "w") as f:
        json.dump({"wall": wall, "requests": results,
                   "system_tokens": {str(k): tokenize(args.tokenize_url, v)
                                     for k, v in prompts.items()}}, f)
    failed = sum(1 for r in results if r.get("status") != 200)
    retried = sum(r.get("retries", 0) for r in results)
    print(f"{len(results)} turns, {failed} failed, {retried} retries, wall {wall:.1f} s",
          file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
