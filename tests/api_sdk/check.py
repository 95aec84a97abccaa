"""The official clients of the APIs past chat, against a running slotgate.

Run by tests/api_sdk.rs with the gateway's base URL. Behind the gateway: two vLLM fakes "a" and
"b" serving model "m" (each remembering only the Responses it made), an Ollama fake serving
model "o", and a llama-server fake serving "stall" whose silent streams the gateway gives up on
after 300 ms.

- OpenAI SDK: `responses.create` plain and streamed; `previous_response_id` follow-ups, which
  only the upstream that made the response can answer; a multipart transcription.
- anthropic SDK: `messages.create` plain and streamed.
- ollama client: `chat` and `generate`, streamed (its default), and `list`.
- Off the happy path (issue #31): anthropic sees `overloaded_error` with its request id on a
  full queue and an error (not a short answer) on a cut stream; openai raises `APIError` at a
  Responses stream the gateway cuts; ollama sees a string error, as a
  refusal and at a cut stream's last line; openai's `models.retrieve` of an id with a slash, and
  its `timeout=2` refused at once by a queue that cannot serve in time.

Exits non-zero with a message on the first failed expectation.
"""

import io
import sys
from concurrent.futures import ThreadPoolExecutor

import anthropic
import ollama
import openai

gateway = sys.argv[1]
# The SDKs retry 5xx on their own; the test wants to see what the gateway answers.
client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=30)
# Held a little, so that requests at once spread over both upstreams.
HOLD = {"x-fake-hold-ms": "300"}


def expect(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


# --- OpenAI Responses ---
plain = client.responses.create(model="m", input="hello")
expect(plain.output_text.startswith("tok0"), "responses.create answers")
expect(plain.id.startswith("resp"), "the response has an id")

events = list(client.responses.create(model="m", input="hello", stream=True))
types = [event.type for event in events]
expect(types[0] == "response.created", "a streamed response starts with response.created")
expect(types[-1] == "response.completed", "and ends with response.completed")
expect(
    "".join(e.delta for e in events if e.type == "response.output_text.delta").startswith("tok0"),
    "the deltas carry the text",
)
streamed_id = events[-1].response.id


def create(stream):
    if not stream:
        return client.responses.create(model="m", input="hello", extra_headers=HOLD).id
    done = [
        e
        for e in client.responses.create(model="m", input="hello", stream=True, extra_headers=HOLD)
        if e.type == "response.completed"
    ]
    return done[0].response.id


with ThreadPoolExecutor(max_workers=6) as pool:
    ids = list(pool.map(create, [False, True, False, True, False, True]))
ids += [plain.id, streamed_id]

# Each follow-up succeeds only on the upstream that made its predecessor.
for previous in ids:
    follow = client.responses.create(model="m", input="and then?", previous_response_id=previous)
    expect(follow.previous_response_id == previous, f"follow-up of {previous} answered")
    chained = [
        e
        for e in client.responses.create(
            model="m", input="and then?", previous_response_id=follow.id, stream=True
        )
        if e.type == "response.completed"
    ]
    expect(len(chained) == 1, f"streamed follow-up of {follow.id} answered")
    expect(client.responses.retrieve(previous).id == previous, f"retrieve {previous}")

try:
    client.responses.create(model="m", input="x", previous_response_id="resp_nowhere")
    expect(False, "an unknown previous_response_id is refused")
except openai.NotFoundError as error:
    expect(error.status_code == 404, "an unknown previous_response_id is a 404")

# --- OpenAI audio (multipart) ---
audio = io.BytesIO(b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(64))
audio.name = "hello.wav"
transcript = client.audio.transcriptions.create(model="m", file=audio)
expect(isinstance(transcript.text, str) and transcript.text, "a transcription answers")

# --- Anthropic Messages ---
claude = anthropic.Anthropic(base_url=gateway, api_key="unused", max_retries=0, timeout=30)
message = claude.messages.create(
    model="m", max_tokens=16, messages=[{"role": "user", "content": "hello"}]
)
expect(message.content[0].text.startswith("tok0"), "messages.create answers")
expect(message.stop_reason in ("end_turn", "max_tokens"), "with a stop reason")
with claude.messages.stream(
    model="m", max_tokens=16, messages=[{"role": "user", "content": "hello"}]
) as stream:
    text = "".join(stream.text_stream)
    final = stream.get_final_message()
expect(text.startswith("tok0"), "a streamed message carries the text")
expect(final.usage.output_tokens > 0, "and its usage")
raw = list(
    claude.messages.create(
        model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}], stream=True
    )
)
expect(raw[0].type == "message_start" and raw[-1].type == "message_stop", "raw events in order")

# --- Ollama ---
local = ollama.Client(host=gateway, timeout=30)
parts = list(local.chat(model="o", messages=[{"role": "user", "content": "hello"}], stream=True))
expect(len(parts) > 1, "ollama chat streams line by line")
expect(parts[-1].done and not parts[0].done, "the last line is done")
expect("".join(p.message.content for p in parts).startswith("tok0"), "chat carries the text")
parts = list(local.generate(model="o", prompt="hello", stream=True))
expect(len(parts) > 1 and parts[-1].done, "ollama generate streams")
expect("".join(p.response for p in parts).startswith("tok0"), "generate carries the text")
names = [m.model for m in local.list().models]
expect(names == ["o"], f"ollama list shows the Ollama models: {names}")

# --- Off the happy path: each client sees errors in its own dialect (issue #31) ---
import threading
import time


def hold(call):
    """Runs `call` in a thread (it holds the only slot of its model); returns the thread."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    time.sleep(0.7)  # it reaches the fake and holds its slot (the hold is 4 s)
    return thread


HOLD_LONG = {"x-fake-hold-ms": "4000"}
message_args = dict(max_tokens=16, messages=[{"role": "user", "content": "hello"}])

# Anthropic, a full queue: its own error object, its request id header, a retryable 503.
holder = hold(lambda: claude.messages.create(model="busy", extra_headers=HOLD_LONG, **message_args))
try:
    claude.messages.create(model="busy", **message_args)
    expect(False, "a full queue is refused")
except anthropic.APIStatusError as error:
    expect(error.status_code == 503, f"a full queue is a 503: {error.status_code}")
    expect(error.type == "overloaded_error", f"anthropic sees overloaded_error: {error.type}")
    expect(error.request_id, "anthropic reads the request id from request-id")
    expect("queue" in (error.api_message or ""), f"with the gateway's message: {error.api_message}")
    expect(error.response.headers.get("retry-after"), "and Retry-After")
holder.join()

# Anthropic, a stream the engine cuts: an error raised, not a silently short answer.
try:
    with claude.messages.stream(
        model="m", extra_headers={"x-fake-fail": "die-after-chunks=3"}, **message_args
    ) as stream:
        "".join(stream.text_stream)
        stream.get_final_message()
    expect(False, "a cut stream raises")
except anthropic.APIStatusError as error:
    expect(error.type == "timeout_error", f"a cut stream raises timeout_error: {error.type}")
    expect(error.body["problem"]["type"].endswith("/upstream-stalled"), "naming the problem")

# Ollama: the error is a string, as Ollama's own.
try:
    local.chat(model="nope", messages=[{"role": "user", "content": "hello"}], stream=False)
    expect(False, "an unknown model is refused")
except ollama.ResponseError as error:
    expect(error.status_code == 404, f"ollama sees the 404: {error.status_code}")
    expect(isinstance(error.error, str), f"ollama's error is a string: {error.error!r}")
    expect("nope" in error.error.lower(), "naming the model")
# The fake cuts this stream after two lines: the client raises at the gateway's error line.
broken = ollama.Client(host=gateway, timeout=30, headers={"x-fake-fail": "die-after-chunks=2"})
try:
    list(broken.generate(model="o", prompt="hello", stream=True))
    expect(False, "a cut Ollama stream raises")
except ollama.ResponseError as error:
    expect(isinstance(error.error, str), f"a cut Ollama stream raises a string error: {error.error!r}")

# OpenAI Responses, a stream the engine stalls or cuts: the gateway's last event carries an
# `error` member, which the SDK raises as `APIError` (OpenAI's own `{"type": "error", …}` event
# has none, and the SDK would only yield it). Both by iterating and with the stream helper.
for fail in ("stall-after-chunks=3", "die-after-chunks=3"):
    seen = []
    try:
        for event in client.responses.create(
            model="stall", input="hello", stream=True, extra_headers={"x-fake-fail": fail}
        ):
            seen.append(event.type)
        expect(False, f"a cut Responses stream raises ({fail}): {seen}")
    except openai.APIStatusError as error:
        expect(False, f"a cut Responses stream is no status error: {error!r}")
    except openai.APIError as error:
        expect(error.code == "upstream_stalled", f"{fail}: APIError upstream_stalled: {error.code}")
        expect(error.type == "server_error", f"of type server_error: {error.type}")
        expect(seen[:1] == ["response.created"], f"after the events before the cut: {seen}")
        expect("response.completed" not in seen, "and no completion")
try:
    with client.responses.stream(
        model="stall", input="hello", extra_headers={"x-fake-fail": "stall-after-chunks=3"}
    ) as stream:
        for _ in stream:
            pass
        stream.get_final_response()
    expect(False, "a stalled Responses stream raises through responses.stream()")
except openai.APIStatusError as error:
    expect(False, f"a stalled Responses stream is no status error: {error!r}")
except openai.APIError as error:
    expect(error.code == "upstream_stalled", f"responses.stream() raises it too: {error.code}")

# OpenAI: `models.retrieve` of an id with a slash (the SDK sends it as %2F).
expect(client.models.retrieve("org/slow").id == "org/slow", "models.retrieve with a slash")

# OpenAI: `timeout=2` reaches the gateway (x-stainless-read-timeout) and a queue that cannot
# serve in time refuses at once. First one held request, so the gateway knows a hold (4 s).
client.chat.completions.create(
    model="org/slow", messages=[{"role": "user", "content": "hi"}], extra_headers=HOLD_LONG
)
holder = hold(
    lambda: client.chat.completions.create(
        model="org/slow", messages=[{"role": "user", "content": "hi"}], extra_headers=HOLD_LONG
    )
)
quick = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0, timeout=2)
started = time.monotonic()
try:
    quick.chat.completions.create(model="org/slow", messages=[{"role": "user", "content": "hi"}])
    expect(False, "a deadline the queue cannot keep is refused")
except openai.APIStatusError as error:
    expect(error.status_code == 503, f"refused with 503: {error.status_code}")
    expect(error.code == "queue_timeout", f"as queue_timeout: {error.code}")
    body = error.response.json()
    expect(body["deadline"] == "x-stainless-read-timeout", f"named by its header: {body}")
    expect("expected_wait_ms" in body, f"refused before queueing: {body}")
except openai.APITimeoutError:
    expect(False, "the gateway answered before the SDK's own timeout")
holder.join()

print("all API client checks passed")
