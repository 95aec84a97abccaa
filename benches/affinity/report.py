#!/usr/bin/env python3
"""Summarise a benches/affinity run: one Markdown table per workload, one row per arm.

    report.py RAW_DIR

RAW_DIR holds, per workload W and arm A, `W-A.json` (the driver's requests) and
`W-A-engines.json` (what each engine counted). "Later turns" are every turn but a
conversation's first, whose prompt no engine can have seen (except a shared system prompt).
"""

from __future__ import annotations

import json
import os
import sys

ARMS = ["pinned", "slotgate-off", "slotgate", "smg"]
NAMES = {"pinned": "pinned per conversation", "slotgate-off": "slotgate, `affinity = \"off\"`",
         "slotgate": "slotgate", "smg": "SMG `--policy cache_aware`"}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def row(raw: str, workload: str, arm: str) -> str | None:
    path = os.path.join(raw, f"{workload}-{arm}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        run = json.load(f)
    with open(os.path.join(raw, f"{workload}-{arm}-engines.json")) as f:
        engines = json.load(f)
    requests = run["requests"]
    ok = [r for r in requests if r.get("status") == 200]
    later = [r for r in ok if r["turn"] > 0]
    reported = [r for r in later if r.get("cached_tokens") is not None and r.get("prompt_tokens")]
    share = (sum(r["cached_tokens"] for r in reported) / sum(r["prompt_tokens"] for r in reported)
             if reported else None)
    ttft = [r["ttft"] for r in later if r.get("ttft") is not None]
    total = [r["total"] for r in later]
    hosts = engines["hosts"]
    served = [h["requests"] for h in hosts]
    all_tokens = sum(h["prompt_tokens"] + h["cached_tokens"] for h in hosts)
    engine_share = (sum(h["cached_tokens"] for h in hosts) / all_tokens) if all_tokens else None
    least = min(served) / sum(served) if sum(served) else None
    failed = len(requests) - len(ok)
    retried = sum(r.get("retries", 0) for r in requests)
    notes = [f"{failed} failed"] * bool(failed) + [f"{retried} retried"] * bool(retried)
    answered = f"{len(ok)}" + (f" ({', '.join(notes)})" if notes else "")
    return (f"| {NAMES[arm]} | {fmt(share)} | {fmt(engine_share)} | {fmt(percentile(ttft, 0.5))} "
            f"| {fmt(percentile(ttft, 0.95))} | {fmt(percentile(total, 0.5))} | {run['wall']:.1f} "
            f"| {' / '.join(map(str, served))} ({fmt(None if least is None else 100 * least, 0)} %) "
            f"| {answered} "
            f"| {engines['load_before']:.1f} → {engines['load_after']:.1f} |")


def main() -> int:
    raw = sys.argv[1]
    for workload, title in (("distinct", "each conversation its own system prompt"),
                            ("shared", "one system prompt shared by all")):
        rows = [r for r in (row(raw, workload, arm) for arm in ARMS) if r]
        if not rows:
            continue
        print(f"\n**{workload}** ({title})\n")
        print("| route by | cached share, later turns (answers) | cached share, all turns "
              "(engines) | later-turn TTFT p50 s | p95 s | later-turn time p50 s | wall s "
              "| requests per host (least) | turns answered | load avg |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
