"""The official OpenAI Python SDK streams a chat from a real llama-server through slotgate.

Run by tests/engine_e2e.rs, which starts llama-server (model id "tiny") and the gateway
in-process and passes the gateway's base URL. Exits non-zero on the first failed expectation.
"""

import sys

import openai

base_url = sys.argv[1]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)


def expect(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


ids = [m.id for m in client.models.list()]
expect(ids == ["tiny"], f"models listed: {ids}")

# A plain chat: the random model says gibberish, but exactly max_tokens of it (ignore_eos).
reply = client.chat.completions.create(
    model="tiny",
    messages=[{"role": "user", "content": "Hello"}],
    max_tokens=16,
    extra_body={"ignore_eos": True},
)
expect(reply.choices[0].finish_reason == "length", f"plain chat ends by length: {reply}")
expect(reply.usage.completion_tokens == 16, f"plain chat usage: {reply.usage}")

# A streamed chat with the usage chunk.
chunks = list(
    client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
)
with_choices = [c for c in chunks if c.choices]
text = "".join(c.choices[0].delta.content or "" for c in with_choices)
expect(len(with_choices) >= 32, f"one chunk per token at least ({len(with_choices)} chunks)")
expect(len(text) > 0, f"streamed text: {text!r}")
expect(with_choices[0].choices[0].delta.role == "assistant", "first chunk carries the role")
expect(with_choices[-1].choices[0].finish_reason == "length", "last choice ends by length")
expect(chunks[-1].usage is not None, "usage chunk at the end")
expect(chunks[-1].usage.completion_tokens == 32, f"usage counts 32 tokens: {chunks[-1].usage}")
print("all engine SDK checks passed")
