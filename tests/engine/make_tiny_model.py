#!/usr/bin/env python3
"""Write a tiny random-weight llama GGUF model for exercising a real llama-server.

The weights are random (the output is gibberish); the format, the tokenizer and the
chat template are real, so llama-server loads it, runs slots, streams, defers and
exports metrics exactly as it would for a real model.

Usage: make_tiny_model.py --vocab VOCAB.gguf --out MODEL.gguf [--seed N]
           [--embd N] [--blocks N] [--heads N] [--ff N] [--ctx N] [--name NAME]

The defaults make the tests' tiny model (64-dim, 2 blocks, 4 heads, 128 feed-forward,
context 2048, about 5 MB). Larger dimensions make a model whose prefill takes visible
time on a CPU, for benchmarks: --embd 256 --blocks 4 --heads 4 --ff 768 --ctx 8192
(about 24 MB) prefills 2,600 tokens in about 0.8 s on one thread (benches/affinity).

VOCAB.gguf is a vocab-only SPM GGUF such as llama.cpp's
models/ggml-vocab-llama-spm.gguf (shipped in the llama-cpp-python sdist).
Needs the PyPI packages `gguf` and `numpy`. The file is written atomically
(temporary name, then rename), so an interrupted run never leaves a half model.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import gguf

ARCH = "llama"
# The tests' tiny model; the command line can change each.
N_EMBD = 64
N_BLOCKS = 2
N_HEAD = 4
N_FF = 128
N_CTX_TRAIN = 2048
NAME = "slotgate-tiny-llama"
RMS_EPS = 1e-5

# ChatML, so `llama-server --jinja` can render /v1/chat/completions requests.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def field_value(reader: gguf.GGUFReader, key: str):
    """The decoded value of one metadata field, or None when absent."""
    field = reader.get_field(key)
    if field is None:
        return None
    if hasattr(field, "contents"):
        return field.contents()
    # Older gguf releases: decode by hand.
    types = field.types
    if types[0] == gguf.GGUFValueType.ARRAY:
        if types[1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if types[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]].tolist()[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", required=True, help="vocab-only SPM GGUF to take the tokenizer from")
    ap.add_argument("--out", required=True, help="where to write the model")
    ap.add_argument("--seed", type=int, default=7, help="seed of the random weights (default 7)")
    ap.add_argument("--embd", type=int, default=N_EMBD, help=f"embedding width (default {N_EMBD})")
    ap.add_argument("--blocks", type=int, default=N_BLOCKS, help=f"transformer blocks (default {N_BLOCKS})")
    ap.add_argument("--heads", type=int, default=N_HEAD, help=f"attention heads, as many KV heads (default {N_HEAD})")
    ap.add_argument("--ff", type=int, default=N_FF, help=f"feed-forward width (default {N_FF})")
    ap.add_argument("--ctx", type=int, default=N_CTX_TRAIN, help=f"training context length (default {N_CTX_TRAIN})")
    ap.add_argument("--name", default=NAME, help=f"general.name (default {NAME})")
    args = ap.parse_args()
    if min(args.embd, args.blocks, args.heads, args.ff, args.ctx) < 1 or args.embd % args.heads:
        print("error: sizes must be positive and --embd a multiple of --heads", file=sys.stderr)
        return 1
    n_embd, n_blocks, n_head, n_ff = args.embd, args.blocks, args.heads, args.ff
    n_head_kv = n_head

    reader = gguf.GGUFReader(args.vocab)
    tok_model = field_value(reader, "tokenizer.ggml.model")
    if tok_model != "llama":
        print(f"error: {args.vocab}: tokenizer.ggml.model is {tok_model!r}, expected 'llama' (SPM)", file=sys.stderr)
        return 1
    tokens = field_value(reader, "tokenizer.ggml.tokens")
    scores = field_value(reader, "tokenizer.ggml.scores")
    token_types = field_value(reader, "tokenizer.ggml.token_type")
    if not tokens or len(tokens) != len(scores) or len(tokens) != len(token_types):
        print(f"error: {args.vocab}: tokenizer arrays missing or of different lengths", file=sys.stderr)
        return 1
    n_vocab = len(tokens)

    rng = np.random.default_rng(args.seed)

    def weight(*shape: int) -> np.ndarray:
        # numpy shape is the reverse of ggml's ne: (rows = outputs, cols = inputs).
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    def norm() -> np.ndarray:
        return np.ones((n_embd,), dtype=np.float32)

    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    tmp = f"{args.out}.tmp.{os.getpid()}"

    w = gguf.GGUFWriter(tmp, ARCH)
    w.add_name(args.name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(args.ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_blocks)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_vocab_size(n_vocab)

    w.add_tokenizer_model("llama")
    pre = field_value(reader, "tokenizer.ggml.pre")
    if pre:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(token_types)
    for key, add in (
        ("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
        ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
        ("tokenizer.ggml.unknown_token_id", w.add_unk_token_id),
        ("tokenizer.ggml.add_bos_token", w.add_add_bos_token),
        ("tokenizer.ggml.add_eos_token", w.add_add_eos_token),
    ):
        value = field_value(reader, key)
        if value is not None:
            add(value)
    w.add_chat_template(CHAT_TEMPLATE)

    n_embd_kv = n_embd // n_head * n_head_kv
    # No output.weight: llama ties the output projection to token_embd when it is absent.
    # The byte-fallback tokens (<0x00>..<0xFF>) get all-zero rows. The output projection is
    # tied to these rows, so their logit is exactly 0 while the best of the other 31,744 random
    # logits is well above it: sampling never picks one. A random model that emitted them would
    # write bytes such as 0xC1 that are never valid UTF-8, and llama-server answers such a
    # non-streamed reply with 500 ("invalid UTF-8 byte"), which made engine tests flaky.
    embd = weight(n_vocab, n_embd)
    embd[np.asarray(token_types) == int(gguf.TokenType.BYTE)] = 0
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", norm())
    for i in range(n_blocks):
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm())
        w.add_tensor(f"blk.{i}.attn_q.weight", weight(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", weight(n_embd_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", weight(n_embd_kv, n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
        w.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))

    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, args.out)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise

    size = os.path.getsize(args.out)
    print(f"wrote {args.out} ({size} bytes, vocab {n_vocab}, {n_blocks} blocks, {n_embd}-dim)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
