#!/usr/bin/env python3
"""Regenerate models.toml from the models' Hugging Face config.json copies.

Sources (read from the local mirrors with `git show`):
  inference-sim/inference-sim @ f90a1e3a6787da17c2cd463dab6fb2660b1b1760 model_configs/<name>/config.json
  inference-sim/training      @ ed5c1d26900e6909758d5e1641a18edaf56a1caf model_configs/Llama-2-70b-hf/config.json
Mixtral-8x22B has no copy in either repository: its figures are transcribed (see MIXTRAL_8X22B).

Parameter counts are computed from the architecture (language model only: embeddings, attention,
MLP/experts incl. router and shared expert, norms, untied lm_head; no vision tower) and compared
with the published size.
"""
import json
import os
import subprocess

BLIS = "/work/.mirror/inference-sim+inference-sim/repo"
BLIS_COMMIT = "f90a1e3a6787da17c2cd463dab6fb2660b1b1760"
TRAINING = "/work/.mirror/inference-sim+training/repo"
TRAINING_COMMIT = "ed5c1d26900e6909758d5e1641a18edaf56a1caf"

# key: (hf_id, source repo, commit, path, published total params, published active params, note)
MODELS = {
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B-Instruct", "blis", "model_configs/llama-3.1-8b-instruct/config.json", 8.03e9, None, ""),
    "qwen3-14b": ("Qwen/Qwen3-14B", "blis", "model_configs/qwen3-14b/config.json", 14.8e9, None, "q_norm/k_norm per head (RMSNorm over head_dim)"),
    "codellama-34b": ("codellama/CodeLlama-34b-Instruct-hf", "blis", "model_configs/codellama-34b-instruct-hf/config.json", 33.7e9, None, ""),
    "llama-2-70b": ("meta-llama/Llama-2-70b-hf", "training", "model_configs/Llama-2-70b-hf/config.json", 69.0e9, None, "torch_dtype float16"),
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-v0.1", "blis", "model_configs/mixtral-8x7b-v0.1/config.json", 46.7e9, 12.9e9, ""),
    "mixtral-8x22b": ("mistralai/Mixtral-8x22B-Instruct-v0.1", "manual", "", 141e9, 39e9,
                      "no config.json copy in BLIS or training; figures from the HF model card/config of "
                      "mistralai/Mixtral-8x22B-Instruct-v0.1 (vocab 32768; the base v0.1 checkpoint has vocab 32000), "
                      "corroborated by a third-party Megatron config table found with the code search"),
    "llama-4-scout-fp8": ("RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic", "blis",
                          "model_configs/llama-4-scout-17b-16e-instruct-fp8-dynamic/config.json", 109e9, 17e9,
                          "multimodal: counts are the text model only (published 109B/17B include the ~0.9B vision tower); "
                          "every layer is MoE (interleave_moe_layer_step=1): 16 routed experts top-1 + 1 shared expert, "
                          "expert intermediate 8192; chunked local attention (attention_chunk_size 8192) on 3 of 4 layers; "
                          "FP8-dynamic (compressed-tensors): expert weights FP8 (per-channel), activations FP8 per-token dynamic; "
                          "attention projections, router, embeddings, lm_head and vision tower stay BF16 (quantization_config.ignore)"),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B-Instruct", "blis", "model_configs/llama-3.1-70b-instruct/config.json", 70.6e9, None, ""),
    "mistral-nemo-12b": ("mistralai/Mistral-Nemo-Instruct-2407", "blis", "model_configs/mistral-nemo-instruct-2407/config.json", 12.2e9, None, "head_dim 128 != hidden/heads (160)"),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", "blis", "model_configs/qwen2.5-7b-instruct/config.json", 7.61e9, None, "q/k/v projections have biases"),
    "yi-34b": ("01-ai/Yi-34B", "blis", "model_configs/yi-34b/config.json", 34.4e9, None, ""),
    "llama-2-7b": ("meta-llama/Llama-2-7b-hf", "blis", "model_configs/llama-2-7b-hf/config.json", 6.74e9, None, "torch_dtype float16; MHA (kv_heads = heads)"),
}

MIXTRAL_8X22B = {
    "architectures": ["MixtralForCausalLM"], "hidden_size": 6144, "num_hidden_layers": 56,
    "num_attention_heads": 48, "num_key_value_heads": 8, "intermediate_size": 16384,
    "vocab_size": 32768, "num_local_experts": 8, "num_experts_per_tok": 2,
    "max_position_embeddings": 65536, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}


def load(src, path):
    if src == "manual":
        return MIXTRAL_8X22B, "manual"
    repo, commit = (BLIS, BLIS_COMMIT) if src == "blis" else (TRAINING, TRAINING_COMMIT)
    text = subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout
    name = "inference-sim/inference-sim" if src == "blis" else "inference-sim/training"
    return json.loads(text), f"{name}@{commit}:{path}"


def count(c, arch):
    H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or H // nh
    attn = H * nh * hd + 2 * H * nkv * hd + nh * hd * H
    if arch == "Qwen2ForCausalLM":
        attn += nh * hd + 2 * nkv * hd  # q/k/v biases
    if arch == "Qwen3ForCausalLM":
        attn += 2 * hd  # q_norm, k_norm
    E = c.get("num_local_experts") or 0
    k = c.get("num_experts_per_tok") or 0
    if E:
        I = c["intermediate_size"]  # per-expert FFN width (Mixtral, Llama-4 text config)
        expert = 3 * H * I
        shared = expert if arch.startswith("Llama4") else 0
        mlp_total = E * expert + shared + H * E
        mlp_active = k * expert + shared + H * E
    else:
        I = c["intermediate_size"]
        mlp_total = mlp_active = 3 * H * I
    norms = 2 * H
    emb = V * H
    head = 0 if c.get("tie_word_embeddings") else V * H
    total = emb + head + H + L * (attn + mlp_total + norms)
    active = emb + head + H + L * (attn + mlp_active + norms)
    return hd, total, active, L * (attn + mlp_total + norms), L * (attn + mlp_active + norms)


def main():
    lines = ["# Model architectures for the sim-to-real benchmark (text model only).",
             "# Generated by scripts/build_models.py; sources per entry. Counts in parameters.",
             "# params_* = computed from the architecture; params_published = the model card's figure.",
             "# params_per_token_* exclude the embedding table (a lookup) but include lm_head.", ""]
    for key, (hf, src, path, pub, pub_active, note) in MODELS.items():
        cfg, where = load(src, path)
        t = cfg.get("text_config", cfg)
        arch = (cfg.get("architectures") or ["Llama4ForConditionalGeneration"])[0]
        if arch == "Llama4ForConditionalGeneration":
            arch = "Llama4ForCausalLM"
        hd, total, active, layers_total, layers_active = count(t, arch)
        E = t.get("num_local_experts") or 0
        fp8 = "FP8" in hf
        V, H = t["vocab_size"], t["hidden_size"]
        head = 0 if t.get("tie_word_embeddings") else V * H
        entry = [
            ("hf_id", hf), ("architecture", arch),
            ("layers", t["num_hidden_layers"]), ("hidden", H),
            ("heads", t["num_attention_heads"]), ("kv_heads", t["num_key_value_heads"]), ("head_dim", hd),
            ("intermediate", t["intermediate_size"]), ("vocab", V),
            ("experts", E), ("active_experts", t.get("num_experts_per_tok") or 0),
            ("moe_intermediate", t["intermediate_size"] if E else 0),
            ("shared_experts", 1 if arch.startswith("Llama4") else 0),
            ("tie_word_embeddings", bool(t.get("tie_word_embeddings", False))),
            ("max_position_embeddings", t["max_position_embeddings"]),
            ("torch_dtype", t.get("torch_dtype") or cfg.get("torch_dtype") or "bfloat16"),
            ("bytes_per_param", 1 if fp8 else 2),
            ("kv_bytes_per_token", 2 * t["num_hidden_layers"] * t["num_key_value_heads"] * hd * 2),
            ("params_computed", total), ("params_active_computed", active),
            ("params_per_token_active", layers_active + head),
            ("params_published", int(pub)), ("params_active_published", int(pub_active or pub)),
            ("source", where), ("notes", note),
        ]
        lines.append(f"[{json.dumps(key)}]")
        for k, v in entry:
            if isinstance(v, bool):
                v = "true" if v else "false"
            elif isinstance(v, str):
                v = json.dumps(v)
            lines.append(f"{k} = {v}")
        lines.append("")
    out = os.path.join(os.path.dirname(__file__), "..", "models.toml")
    with open(out, "w") as fh:
        fh.write("\n".join(lines))


if __name__ == "__main__":
    main()
