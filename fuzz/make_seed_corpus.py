#!/usr/bin/env python3
"""Writes the seed inputs in fuzz/corpus/ (committed; rerun only to change them).

Small valid and near-valid inputs for each target. The stories260K-derived
seeds need the real model files (--models-dir, default ../shared/models)."""
import argparse
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--models-dir", default=os.path.join(HERE, "..", "..", "shared", "models"))
models = parser.parse_args().models_dir
random.seed(1)


def put(target, name, data):
    os.makedirs(os.path.join(HERE, "corpus", target), exist_ok=True)
    with open(os.path.join(HERE, "corpus", target, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# --- fuzz_checkpoint: 7 int32 header, then fp32 tensors ----------------------
def floats_implied(dim, hidden, layers, heads, kv_heads, vocab, seq_len, shared):
    head_dim = dim // heads
    kv_dim = head_dim * kv_heads
    per_layer = 2 * dim + heads * head_dim * dim + 2 * kv_dim * dim + dim * heads * head_dim + 3 * hidden * dim
    classifier = 0 if shared else vocab * dim
    return vocab * dim + layers * per_layer + dim + classifier + 2 * seq_len * (head_dim // 2)


def checkpoint(name, dims, shared, extra_floats=0):
    n = floats_implied(*dims, shared) + extra_floats
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = dims
    header = struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab if shared else -vocab, seq_len)
    put("fuzz_checkpoint", name, header + struct.pack("<%df" % n, *[random.uniform(-1, 1) for _ in range(n)]))


checkpoint("valid_minimal_shared", (2, 1, 1, 1, 1, 1, 1), True)
checkpoint("valid_minimal_separate", (2, 1, 1, 1, 1, 3, 1), False)
checkpoint("valid_gqa_4_2", (8, 5, 2, 4, 2, 5, 3), True)
checkpoint("one_float_short", (2, 1, 1, 1, 1, 1, 1), True, extra_floats=-1)
checkpoint("one_float_long", (2, 1, 1, 1, 1, 1, 1), True, extra_floats=1)
put("fuzz_checkpoint", "header_odd_head_dim", struct.pack("<7i", 6, 4, 1, 2, 1, 3, 2) + bytes(64))
put("fuzz_checkpoint", "header_absurd_sizes", struct.pack("<7i", 65536, 262144, 1024, 1024, 1024, -(1 << 20), 1 << 20))
stories = open(os.path.join(models, "stories260K.bin"), "rb").read()
put("fuzz_checkpoint", "stories260K_header_only", stories[:28])
put("fuzz_checkpoint", "stories260K_truncated_256", stories[:256])
put("fuzz_checkpoint", "short_header", stories[:20])


# --- fuzz_tokenizer_load: 2 bytes (vocab_size - 1), then a tokenizer.bin ----
def vocab(n):
    return struct.pack("<H", n - 1)


def tokenizer(pieces):
    out = struct.pack("<i", max(1, max(len(p) for p in pieces)))
    for i, piece in enumerate(pieces):
        out += struct.pack("<fi", float(-i), len(piece)) + piece
    return out


tok512 = open(os.path.join(models, "tok512.bin"), "rb").read()
put("fuzz_tokenizer_load", "tok512", vocab(512) + tok512)
put("fuzz_tokenizer_load", "tok512_truncated", vocab(512) + tok512[:1000])
put("fuzz_tokenizer_load", "tok512_as_vocab_300", vocab(300) + tok512)
put("fuzz_tokenizer_load", "small_8", vocab(8) + tokenizer([b"<unk>", b"\n<s>\n", b"\n</s>\n", b" ", b"a", b"b", b" a", b"ab"]))
byte_pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % i for i in range(256)]
byte_pieces += [b" ", b"O", b"n", b"c", b"e", b"On", b"nc", b" O", b" On", b" Once"]
put("fuzz_tokenizer_load", "bytes_and_merges", vocab(len(byte_pieces)) + tokenizer(byte_pieces))
put("fuzz_tokenizer_load", "empty_piece", vocab(4) + tokenizer([b"<unk>", b"", b"x", b"xx"]))
put("fuzz_tokenizer_load", "bad_length", vocab(2) + struct.pack("<i", 4) + struct.pack("<fi", 0.0, -1))

# --- fuzz_tokenizer_encode: prompt bytes ------------------------------------
for name, text in {
    "once": b"Once upon a time, there was a little girl named Lily.",
    "utf8": "caf\u00e9 \u00fcber \u65e5\u672c \U0001F600".encode(),
    "invalid_utf8": b"\xff\xfe\xc3\x28\xa0\xa1\xe2\x28\xa1\xf0\x28\x8c\xbc",
    "spaces": b"  two  spaces\tand\nnewlines  ",
    "byte_token_text": b"<0x41> <s> </s> <unk>",
    "single": b"x",
    "empty": b"",
}.items():
    put("fuzz_tokenizer_encode", name, text)

# --- fuzz_command_line: words split at whitespace ---------------------------
for name, words in {
    "typical": "--steps 64 --prompt Once --temperature 0.8 --top-p 0.9 --seed 7",
    "lists": "--k 2,4,8 --repeats 3 --kv-budget-gib 0.5 --fraction 0.25 --seq-lens 256,1024",
    "help": "--help",
    "quick_full": "--quick --full",
    "equals": "--steps=5 --device=cpu --variant=0,1 --json=out.json",
    "huge_steps": "--steps 99999999999999999999",
    "negative": "--seed -1 --temperature -0.5",
    "not_finite": "--temperature inf --top-p nan --kv-budget-gib 1e999",
    "flags": "--list --quick=1 --flag=false --on --off=true --no-loopback=0",
    "unknown": "--no-such-flag x",
    "model": "--model m.bin --tokenizer t.bin --preset small",
    "hex": "--steps 0x10 --k 0x7fffffff",
    # What the target found before parse_command_line caught CLI11's
    # std::out_of_range (a negatable flag's value past 64 bits).
    "found_negated_flag_out_of_range": "-rliiaia --off=2136178214 --off=213178261782147483648-",
}.items():
    put("fuzz_command_line", name, words)

# --- fuzz_completion_request: request bodies --------------------------------
# The bodies the official `openai` npm client (v4) sends for the calls a user
# makes (it sends the parameters as given, as JSON), then bad ones.
for name, body in {
    "completion": '{"model":"stories260K","prompt":"Once upon a time","max_tokens":20,"temperature":0}',
    "completion_stream": '{"model":"stories260K","prompt":"Once upon a time","max_tokens":20,"stream":true,'
                         '"stream_options":{"include_usage":true}}',
    "completion_n_seed": '{"model":"stories260K","prompt":"Once upon a time","max_tokens":16,"n":4,"seed":7,'
                         '"temperature":0.8,"top_p":0.95}',
    "completion_stop": '{"model":"stories260K","prompt":"Once upon a time","max_tokens":64,"stop":[".","\\n",'
                       '" Lily"]}',
    "completion_logprobs": '{"model":"stories260K","prompt":"Once upon a time","max_tokens":5,"logprobs":3,'
                           '"user":"someone"}',
    "completion_token_ids": '{"model":"stories260K","prompt":[1,403,407,261],"max_tokens":8,"stop":"a"}',
    "chat": '{"model":"stories260K","messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":20}',
    "chat_stream": '{"model":"stories260K","messages":[{"role":"user","content":"Once upon a time"}],'
                   '"max_tokens":20,"stream":true,"stream_options":{"include_usage":true}}',
    "chat_parts": '{"model":"stories260K","messages":[{"role":"system","content":"You tell stories."},'
                  '{"role":"user","name":"kid","content":[{"type":"text","text":"Once upon"},'
                  '{"type":"text","text":" a time"}]}],"max_completion_tokens":20}',
    "chat_logprobs": '{"model":"stories260K","messages":[{"role":"developer","content":"Be brief."},'
                     '{"role":"user","content":"Tom"},{"role":"assistant","content":"had a dog"}],'
                     '"logprobs":true,"top_logprobs":2,"max_tokens":4}',
    "chat_n_stop": '{"model":"stories260K","messages":[{"role":"user","content":"Lily"}],"n":3,"seed":3,'
                   '"temperature":1,"stop":"\\n","stream":true}',
    "chat_nulls": '{"model":null,"messages":[{"role":"user","content":"caf\\u00e9 \\ud83d\\ude00"}],'
                  '"max_tokens":null,"temperature":null,"stop":null,"logprobs":null,"stream_options":null}',
    "bad_unknown_field": '{"model":"stories260K","prompt":"x","max_token":5,"frequency_penalty":0}',
    "bad_image_part": '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}',
    "bad_numbers": '{"prompt":[1,2.5,-1,512],"max_tokens":-5,"n":9,"temperature":1e300,"top_p":0}',
    "bad_stream_options": '{"prompt":"x","stream_options":{"include_usage":true},"top_logprobs":2}',
    "bad_context": '{"prompt":[1],"max_tokens":100000000000000000000000}',
    "bad_json": '{"prompt": "Once upon',
    "bad_nesting": '{"messages":' + '[' * 64 + ']' * 64 + '}',
}.items():
    put("fuzz_completion_request", name, body)
