"""The status page in a real browser (run by tests/ui/run.sh, which starts everything).

Behind the gateway: two fake llama-servers, "host-a" and "host-b", each with 2 slots serving
"chat-model" (2 slots and 2 queue places per host in the gateway). The admin token is set.

Checks, in order, each wait bounded:
1. the page loads with no console error and asks for the token;
2. a wrong token is refused, and the refusal is shown;
3. with the right token, every upstream and model is shown, and after a few answers each
   host's cache hit share;
4. under a burst, the slot and queue numbers on the page rise, then fall back to 0;
5. draining host-a from the page makes the gateway stop sending it requests (the fake's own
   request counter stands still), and undraining brings them back;
6. a drain with a wrong token is refused and shown, and changes nothing.
"""

import argparse
import concurrent.futures
import json
import re
import time

from common import http_call as http, run, wait_until
from playwright.sync_api import expect, sync_playwright

MODEL = "chat-model"
WAIT_MS = 15_000  # any one thing the page should show soon


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", required=True)
    parser.add_argument("--admin", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--fake", action="append", required=True, help="NAME=URL")
    parser.add_argument("--chromium", required=True)
    parser.add_argument("--screenshot", required=True)
    return parser.parse_args()


def chat(api, hold_ms=0, prompt="hi"):
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": prompt}]}).encode()
    headers = {"content-type": "application/json"}
    if hold_ms:
        headers["x-fake-hold-ms"] = str(hold_ms)
    return http("POST", api + "/v1/chat/completions", headers, body)[0]


def served(fake_url):
    """Requests the fake has started: its n_decode_total (the fake counts one per request)."""
    status, text = http("GET", fake_url + "/metrics")
    assert status == 200, (status, text)
    match = re.search(r"^llamacpp:n_decode_total (\d+)$", text, re.M)
    assert match, text
    return int(match.group(1))


def upstream_state(admin, token, name):
    status, text = http("GET", admin + "/admin/upstreams", {"authorization": "Bearer " + token})
    assert status == 200, (status, text)
    return next(u for u in json.loads(text)["upstreams"] if u["name"] == name)


def burst(pool, api, count, hold_ms):
    return [pool.submit(chat, api, hold_ms) for _ in range(count)]


def main():
    args = parse_args()
    fakes = dict(item.split("=", 1) for item in args.fake)
    admin, api, token = args.admin, args.api, args.token
    started = time.monotonic()

    wait_until("the gateway to be ready", lambda: http("GET", admin + "/readyz", timeout=2)[0] == 200)
    for name in fakes:
        wait_until(f"{name} healthy", lambda: upstream_state(admin, token, name)["health"]["status"] == "healthy")

    console = []  # (phase, text) of every console error and uncaught exception
    phase = ["load"]
    with sync_playwright() as p, concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--headless=new"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.set_default_timeout(WAIT_MS)
            page.on("console", lambda m: m.type == "error" and console.append((phase[0], m.text)))
            page.on("pageerror", lambda e: console.append((phase[0], f"uncaught: {e}")))

            # 1. Load: no console error, and the token is asked for before anything is fetched.
            page.goto(admin + "/ui", wait_until="networkidle")
            expect(page.locator("#token-form")).to_be_visible()
            assert not console, f"console errors on load: {console}"

            # 2. A wrong token is refused and shown.
            phase[0] = "wrong token"
            page.fill("#token", token + "-wrong")
            page.click("#token-form button[type=submit]")
            expect(page.locator("#token-error")).to_contain_text("401")
            expect(page.locator("#token-form")).to_be_visible()
            expect(page.locator("[data-upstream]")).to_have_count(0)

            # 3. The right one: every upstream and model.
            phase[0] = "live"
            page.fill("#token", token)
            page.click("#token-form button[type=submit]")
            expect(page.locator("#connection")).to_have_text("live")
            expect(page.locator("#token-form")).to_be_hidden()
            expect(page.locator("[data-upstream]")).to_have_count(len(fakes))
            for name in fakes:
                card = page.locator(f'[data-upstream="{name}"]')
                expect(card.locator("h2")).to_have_text(name)
                expect(card.locator('[data-field="health"]')).to_contain_text("healthy")
                expect(card.locator(f'[data-model="{MODEL}"] h3')).to_contain_text(MODEL)
                expect(card.locator(f'[data-model="{MODEL}"] [data-field="parallel"]')).to_have_text("2")
                expect(card.locator(f'[data-model="{MODEL}"] [data-field="in-flight"]')).to_have_text("0")

            # A few answers first, so the figures the screenshot shows have values: each
            # host's cache hit share, from the prompt tokens its engine reported.
            # Four at once reach both hosts; then, one after the other, a prompt long enough
            # for its repeats to hit a cache (the gateway sends them where it is).
            statuses = [f.result(timeout=60) for f in burst(pool, api, 4, 300)]
            prompt = " ".join(f"word{i}" for i in range(40))
            statuses += [chat(api, prompt=prompt) for _ in range(3)]
            assert statuses == [200] * 7, statuses
            cache_hit = re.compile(r"\d+% of \d+ reported")
            for cell in page.locator('[data-field="cache-hit"]').all():
                expect(cell).to_have_text(cache_hit)

            # 4. A burst: 4 run, 4 queue (2 and 2 per host), then all drains away.
            in_flight = page.locator(f'[data-model="{MODEL}"] [data-field="in-flight"]')
            queued = page.locator(f'[data-model="{MODEL}"] [data-field="queued"]')
            futures = burst(pool, api, 8, 3000)
            expect(in_flight).to_have_text(["2", "2"])
            expect(queued).to_have_text(["2", "2"])
            expect(page.locator(".state-word").first).to_have_text("FULL")
            # For the screenshot only, not a check: let a health check (every 1 s) see the
            # burst, so the "engine busy · gateway in flight" line shows it too, and the
            # sparklines get a few samples. Whatever the timing, the screenshot is taken.
            try:
                expect(page.locator('[data-field="reconcile"]').first).to_contain_text(
                    "engine busy 2", timeout=2000
                )
            except AssertionError:
                pass
            page.screenshot(path=args.screenshot, full_page=True)
            assert sorted(f.result(timeout=60) for f in futures) == [200] * 8
            expect(in_flight).to_have_text(["0", "0"], timeout=WAIT_MS)
            expect(queued).to_have_text(["0", "0"], timeout=WAIT_MS)
            # The waits of the queued ones reached the page's percentiles.
            expect(page.locator('[data-field="queue-wait"]').first).to_contain_text("in 5 min")

            # 5. Drain host-a from the page; the gateway stops sending it requests.
            card_a = page.locator('[data-upstream="host-a"]')
            card_a.locator('[data-action="drain"]').click()
            expect(page.locator("#action-form")).to_be_visible()
            # The token the page was given is offered, kept in page memory only.
            expect(page.locator("#action-token")).to_have_value(token)
            page.click("#action-confirm")
            expect(page.locator("#action-done")).to_have_text("host-a is draining")
            expect(card_a.locator('[data-field="draining"]')).to_be_visible()
            expect(card_a.locator('[data-action="drain"]')).to_have_text("Undrain")
            assert upstream_state(admin, token, "host-a")["draining"] is True
            before = {name: served(url) for name, url in fakes.items()}
            statuses = [f.result(timeout=60) for f in burst(pool, api, 4, 300)]
            assert statuses == [200] * 4, statuses
            after = {name: served(url) for name, url in fakes.items()}
            assert after["host-a"] == before["host-a"], ("a drained host got requests", before, after)
            assert after["host-b"] == before["host-b"] + 4, (before, after)

            # Undrain: requests come back to host-a (4 at once: host-b alone has 2 slots).
            card_a.locator('[data-action="drain"]').click()
            page.click("#action-confirm")
            expect(page.locator("#action-done")).to_have_text("host-a takes requests again")
            expect(card_a.locator('[data-field="draining"]')).to_be_hidden()
            assert upstream_state(admin, token, "host-a")["draining"] is False
            statuses = [f.result(timeout=60) for f in burst(pool, api, 4, 1000)]
            assert statuses == [200] * 4, statuses
            assert served(fakes["host-a"]) > after["host-a"], "host-a got no request after undrain"

            # 6. A drain with a wrong token: refused, shown, and nothing changes.
            phase[0] = "wrong drain token"
            page.locator('[data-upstream="host-b"] [data-action="drain"]').click()
            page.fill("#action-token", "not-the-token")
            page.click("#action-confirm")
            expect(page.locator("#action-error")).to_contain_text("401")
            expect(page.locator("#action-form")).to_be_visible()
            assert upstream_state(admin, token, "host-b")["draining"] is False
            page.click("#action-cancel")

            # Only the refusals this test asked for were logged (the browser logs a 401 it
            # received as an error); no script error at any point.
            unexpected = [(ph, text) for ph, text in console if "401" not in text]
            assert not unexpected, f"console errors: {unexpected}"
            assert {ph for ph, _ in console} <= {"wrong token", "wrong drain token"}, console
        finally:
            browser.close()
    print(f"status page checks passed in {time.monotonic() - started:.1f}s; screenshot {args.screenshot}")


if __name__ == "__main__":
    run(main)
