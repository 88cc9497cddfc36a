#!/usr/bin/env python3
"""Writes the small random-weight Llama-architecture GGUF model that the
engine tests serve with llama.cpp's llama-server (scripts/llama-deps.sh).

Deterministic: the same bytes on every run (numpy's PCG64 with a fixed seed,
f16 weights). 4 layers, 512 wide, 8 heads (4 KV heads), feed-forward 1536,
a 32,000-token SentencePiece-style vocabulary. The output rows of the
control, unknown and byte tokens are zero, so their logits are exactly 0
while the best of ~31,700 random logits is far above 0: neither greedy nor
top-k sampling ever emits end-of-sequence, and every answer is exactly
`max_tokens` long. The tokens are noise; the timing is a real engine's.

    llama-model.py [--layers N] OUT.gguf          write the model (N layers, default 4)
    llama-model.py --check [--layers N] OUT.gguf  exit 0 when OUT.gguf is this script's model

The 16-layer variant (`--layers 16`, the same widths: about twice the time per
token) is the "changed engine" of the drift test (tests/it/engine.rs).
"""

import hashlib
import os
import sys

import gguf
import numpy as np

SEED = 20261201
N_VOCAB = 32000
N_EMBD = 512
N_LAYER = 4
N_HEAD = 8
N_HEAD_KV = 4
N_FF = 1536
N_CTX = 8192


def script_digest() -> str:
    with open(__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def vocab():
    tokens, scores, types = [], [], []

    def add(tok, score, typ):
        tokens.append(tok.encode("utf-8"))
        scores.append(score)
        types.append(typ)

    add("<unk>", 0.0, gguf.TokenType.UNKNOWN)
    add("<s>", 0.0, gguf.TokenType.CONTROL)
    add("</s>", 0.0, gguf.TokenType.CONTROL)
    for b in range(256):
        add(f"<0x{b:02X}>", 0.0, gguf.TokenType.BYTE)
    letters = "abcdefghijklmnopqrstuvwxyz"
    seen = set()
    words = []
    for c in letters + letters.upper() + "0123456789.,:;!?'\"()-":
        words.append(c)
    n = 0
    while len(words) < N_VOCAB:
        # base-26 words of growing length: a..z, aa..zz, aaa..
        w, k = "", n
        while True:
            w = letters[k % 26] + w
            k = k // 26 - 1
            if k < 0:
                break
        words.append(w)
        words.append("\u2581" + w)
        n += 1
    i = 0
    for w in words:
        if len(tokens) >= N_VOCAB:
            break
        if w in seen:
            continue
        seen.add(w)
        add(w, -float(i), gguf.TokenType.NORMAL)
        i += 1
    return tokens, scores, types


def write(path: str, n_layer: int) -> None:
    rng = np.random.Generator(np.random.PCG64(SEED))

    def w(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    tokens, scores, types = vocab()
    tmp = path + ".part"
    out = gguf.GGUFWriter(tmp, "llama")
    out.add_name(f"qsim-tiny-llama {n_layer} layers (random weights)")
    out.add_context_length(N_CTX)
    out.add_embedding_length(N_EMBD)
    out.add_block_count(n_layer)
    out.add_feed_forward_length(N_FF)
    out.add_head_count(N_HEAD)
    out.add_head_count_kv(N_HEAD_KV)
    out.add_rope_dimension_count(N_EMBD // N_HEAD)
    out.add_layer_norm_rms_eps(1e-5)
    out.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    out.add_tokenizer_model("llama")
    out.add_token_list(tokens)
    out.add_token_scores(scores)
    out.add_token_types(types)
    out.add_bos_token_id(1)
    out.add_eos_token_id(2)
    out.add_unk_token_id(0)
    out.add_add_bos_token(True)
    out.add_add_eos_token(False)
    out.add_chat_template(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    out.add_tensor("token_embd.weight", w(N_VOCAB, N_EMBD))
    kv = N_EMBD // N_HEAD * N_HEAD_KV
    for i in range(n_layer):
        p = f"blk.{i}."
        out.add_tensor(p + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        out.add_tensor(p + "attn_q.weight", w(N_EMBD, N_EMBD))
        out.add_tensor(p + "attn_k.weight", w(kv, N_EMBD))
        out.add_tensor(p + "attn_v.weight", w(kv, N_EMBD))
        out.add_tensor(p + "attn_output.weight", w(N_EMBD, N_EMBD))
        out.add_tensor(p + "ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        out.add_tensor(p + "ffn_gate.weight", w(N_FF, N_EMBD))
        out.add_tensor(p + "ffn_up.weight", w(N_FF, N_EMBD))
        out.add_tensor(p + "ffn_down.weight", w(N_EMBD, N_FF))
    out.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    head = w(N_VOCAB, N_EMBD)
    special = [i for i, t in enumerate(types) if t != gguf.TokenType.NORMAL]
    head[special, :] = 0
    out.add_tensor("output.weight", head)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    os.replace(tmp, path)
    with open(path + ".stamp", "w") as f:
        f.write(f"{script_digest()} {n_layer}")


def main() -> int:
    args = sys.argv[1:]
    check = args[:1] == ["--check"]
    if check:
        args = args[1:]
    n_layer = N_LAYER
    if args[:1] == ["--layers"] and len(args) >= 2 and args[1].isdigit() and 1 <= int(args[1]) <= 64:
        n_layer = int(args[1])
        args = args[2:]
    if len(args) != 1:
        print("usage: llama-model.py [--check] [--layers N (1..64)] OUT.gguf", file=sys.stderr)
        return 2
    path = args[0]
    if check:
        try:
            with open(path + ".stamp") as f:
                ok = f.read() == f"{script_digest()} {n_layer}" and os.path.getsize(path) > 0
        except OSError:
            ok = False
        return 0 if ok else 1
    write(path, n_layer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
