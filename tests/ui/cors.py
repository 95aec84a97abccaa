"""CORS from a real browser (run by tests/ui/cors.sh, which starts the gateway and the fake).

The gateway lists one page origin in `cors_origins` (http://127.0.0.1:ALLOWED) and requires a
client key; its one model has one slot and no queue. This script serves a blank page on two
origins, ALLOWED and OTHER (another loopback port), opens each in headless Chromium and calls
the API from the page with `fetch`, as a browser chat UI would. Every call sends
`Authorization` and a JSON `Content-Type`, so the browser preflights each one (`OPTIONS`) and
sends the request only if the preflight's answer allows it.

Checks, in order, each bounded:
1. from the listed origin, a chat completion succeeds and its body and the exposed
   `x-request-id` are readable;
2. a refusal is readable there too: a wrong key's 401, and a full queue's 503 with its exposed
   `Retry-After`, each with its problem document;
3. a streamed answer is read chunk by chunk from `response.body`, to its `[DONE]`;
4. from the other origin, the same call is blocked by the browser: `fetch` rejects, and the
   request never reaches the engine.
"""

import argparse
import http.server
import json
import re
import threading
import time

from common import http_call, run, wait_until
from playwright.sync_api import sync_playwright

MODEL = "chat-model"
FETCH_MS = 20_000  # how long one fetch from the page may take before it is aborted
PAGE = b"<!doctype html><meta charset=utf-8><title>a chat UI on another origin</title>"

# Runs in the page: one `fetch`, and what a script there can read of its answer (or why it
# failed). `stream`: read the body chunk by chunk, as a chat UI shows tokens.
FETCH_JS = """
async ([url, init, stream, limitMs]) => {
  try {
    const r = await fetch(url, {...init, signal: AbortSignal.timeout(limitMs)});
    const out = {
      status: r.status,
      requestId: r.headers.get("x-request-id"),
      retryAfter: r.headers.get("retry-after"),
      contentType: r.headers.get("content-type"),
    };
    if (stream) {
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let text = "", reads = 0;
      for (;;) {
        const {done, value} = await reader.read();
        if (done) break;
        reads += 1;
        text += decoder.decode(value, {stream: true});
      }
      out.reads = reads;
      out.text = text;
    } else {
      out.text = await r.text();
    }
    return out;
  } catch (e) {
    return {failed: String(e)};
  }
}
"""


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", required=True)
    parser.add_argument("--fake", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--allowed-port", type=int, required=True)
    parser.add_argument("--other-port", type=int, required=True)
    parser.add_argument("--chromium", required=True)
    return parser.parse_args()


class Page(http.server.BaseHTTPRequestHandler):
    """The blank page every origin serves."""

    def do_GET(self):  # noqa: N802 (the handler's name is http.server's)
        self.send_response(200)
        self.send_header("content-type", "text/html; charset=utf-8")
        self.send_header("content-length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args):
        pass


def serve_page(port):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def fake_metric(fake, name):
    status, text = http_call("GET", fake + "/metrics")
    assert status == 200, (status, text)
    match = re.search(rf"^llamacpp:{name} (\d+)", text, re.M)
    assert match, text
    return int(match.group(1))


def chat_init(key, stream=False):
    """The `fetch` options of a chat completion, as a chat UI sends them. A stream's tokens are
    spread over 800 ms by the fake, so the page reads them as they come."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    if stream:
        headers["x-fake-hold-ms"] = "800"
    return {"method": "POST", "headers": headers, "body": json.dumps(body)}


def main():
    args = parse_args()
    api, key, fake = args.api, args.key, args.fake
    chat_url = api + "/v1/chat/completions"
    started = time.monotonic()
    for port in (args.allowed_port, args.other_port):
        serve_page(port)
    auth = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    plain_chat = chat_init(key)["body"].encode()
    wait_until(
        "the gateway to serve the model",
        lambda: http_call("POST", chat_url, auth, plain_chat, timeout=5)[0] == 200,
    )

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--headless=new"])
        try:
            page = browser.new_page()
            call = lambda init, stream=False: page.evaluate(  # noqa: E731
                FETCH_JS, [chat_url, init, stream, FETCH_MS]
            )

            # 1. The listed origin: the preflighted call succeeds and everything is readable.
            page.goto(f"http://127.0.0.1:{args.allowed_port}/")
            ok = call(chat_init(key))
            assert ok.get("status") == 200, f"the listed origin's call: {ok}"
            answer = json.loads(ok["text"])
            assert answer["choices"][0]["message"]["content"], answer
            assert ok["requestId"], f"x-request-id is exposed to the page: {ok}"

            # 2. Refusals are readable: a wrong key…
            refused = call(chat_init(key + "-wrong"))
            assert refused.get("status") == 401, f"a wrong key: {refused}"
            doc = json.loads(refused["text"])
            assert doc["type"].endswith("/unauthorized"), doc
            assert refused["requestId"] == doc["request_id"], refused
            # …and a full queue, while another client holds the only slot.
            before = fake_metric(fake, "n_decode_total")
            hold = {**auth, "x-fake-hold-ms": "5000"}
            holder = threading.Thread(
                target=http_call,
                args=("POST", chat_url, hold, plain_chat),
                daemon=True,
            )
            holder.start()
            wait_until("the slot taken", lambda: fake_metric(fake, "requests_processing") == 1)
            full = call(chat_init(key))
            assert full.get("status") == 503, f"a full queue: {full}"
            assert json.loads(full["text"])["type"].endswith("/queue-full"), full
            assert full["retryAfter"] and int(full["retryAfter"]) >= 1, f"Retry-After: {full}"
            holder.join(timeout=30)
            assert fake_metric(fake, "n_decode_total") == before + 1, "only the holder ran"

            # 3. A stream, read as it arrives.
            streamed = call(chat_init(key, stream=True), stream=True)
            assert streamed.get("status") == 200, f"a stream: {streamed}"
            assert streamed["contentType"].startswith("text/event-stream"), streamed
            events = [e for e in streamed["text"].split("\n\n") if e.startswith("data: ")]
            assert events[-1] == "data: [DONE]", streamed["text"]
            text = "".join(
                json.loads(e[6:])["choices"][0]["delta"].get("content") or ""
                for e in events[:-1]
            )
            assert text, streamed["text"]

            # 4. Another origin: the browser refuses the preflight's answer and never sends the
            # request itself.
            before = fake_metric(fake, "n_decode_total")
            page.goto(f"http://127.0.0.1:{args.other_port}/")
            blocked = call(chat_init(key))
            assert "failed" in blocked, f"the unlisted origin was let through: {blocked}"
            assert "TypeError" in blocked["failed"], blocked
            assert fake_metric(fake, "n_decode_total") == before, "the blocked call ran"
        finally:
            browser.close()
    print(
        f"CORS browser checks passed in {time.monotonic() - started:.1f}s "
        f"(stream read in {streamed['reads']} chunks)"
    )


if __name__ == "__main__":
    run(main)
