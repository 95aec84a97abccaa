"""The official OpenAI Python SDK against a running slotgate.

Run by tests/openai_sdk.rs, which starts a fake llama-server and the gateway in-process and
passes the gateway's base URL, and for a gateway that speaks TLS, the file of the private CA
that signed its certificate (the SDK then trusts that CA only). Model "qwen" has 1 slot and no
queue, so a second request while one holds the slot is refused with 503 at once.

Exits non-zero with a message on the first failed expectation.
"""

import ssl
import sys
import threading

import openai

base_url = sys.argv[1]
http_client = None
if len(sys.argv) > 2:
    tls = ssl.create_default_context(cafile=sys.argv[2])
    http_client = openai.DefaultHttpxClient(verify=tls)
# The SDK retries 5xx on its own (honouring Retry-After); the test wants to see the refusal.
client = openai.OpenAI(
    base_url=base_url, api_key="unused", max_retries=0, timeout=30, http_client=http_client
)


def expect(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


# A plain chat.
reply = client.chat.completions.create(
    model="qwen", messages=[{"role": "user", "content": "hello"}]
)
expect(reply.choices[0].message.content.startswith("tok0"), "plain chat answers")
expect(reply.usage is not None and reply.usage.completion_tokens > 0, "plain chat has usage")

# A streamed chat, through the alias.
chunks = list(
    client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
)
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
expect(len(chunks) > 3, f"streamed chat arrives in chunks ({len(chunks)})")
expect(text.startswith("tok0"), "streamed chat text")
expect(chunks[-1].usage is not None, "usage chunk at the end")

# The model list, alias included.
ids = sorted(m.id for m in client.models.list())
expect(ids == ["chat", "qwen"], f"models listed: {ids}")

# An unknown model is the SDK's NotFoundError.
try:
    client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
    expect(False, "unknown model refused")
except openai.NotFoundError as e:
    expect(e.status_code == 404, "unknown model is NotFoundError (404)")
    expect("gpt-4" in str(e), f"its message names the model: {e}")

# A full model is a 503 with Retry-After, the SDK's InternalServerError.
# The holder may lose the race for the slot to a probe below; it then retries (the SDK's own
# retry, honouring Retry-After) until it holds the slot, so a probe is eventually refused.
holder = client.with_options(max_retries=20)
holding = threading.Thread(
    target=lambda: holder.chat.completions.create(
        model="qwen",
        messages=[{"role": "user", "content": "hold"}],
        extra_headers={"x-fake-hold-ms": "3000"},
    )
)
holding.start()
refused = None
for _ in range(200):  # until the holder has the slot (up to ~10 s)
    try:
        client.chat.completions.create(
            model="qwen", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )
    except openai.InternalServerError as e:
        refused = e
        break
    except Exception as e:  # noqa: BLE001 - report anything unexpected
        expect(False, f"unexpected error {type(e).__name__}: {e}")
    threading.Event().wait(0.05)
holding.join()
expect(refused is not None, "a request past the cap is refused")
expect(refused.status_code == 503, "refusal is InternalServerError (503)")
expect(int(refused.response.headers["retry-after"]) >= 1, "refusal carries Retry-After")
expect(refused.code == "queue_full", f"error code is queue_full: {refused.code}")
print("all OpenAI SDK checks passed")
