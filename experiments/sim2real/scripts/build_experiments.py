#!/usr/bin/env python3
"""Regenerate experiments.toml: one [[experiments]] table per test/training experiment.

Inputs:
  * the error records (same mirrored files as extract_records.py): model, hardware, tp, dp,
    precision, cpu_offload, gpu_mem_util, max_num_batched_tokens, and the stage indices seen;
  * the workload presets of inference-sim/tektonc-data-collection `workloads.yaml`
    (commit 2a7cbcd4e2338cad6d6cb2d9f119728ecd0d4fbd; transcribed below as PRESETS, identical to
    the `profileTemplate` of every campaign values.yaml read, see CAMPAIGN);
  * the campaign manifest blis-campaign/experiments.json @ c3a09fb949f31431dc71444f485f73e8ce1ffc97
    (same numbering as the error records; transcribed below as MANIFEST_NOTES);
  * the campaign folders blis-campaign/campaign/<n>-.../{experiment.json,values.yaml} at
    bc8f22902803b99db17c60417db959797a36ec8d / 0f7f91c9434483286f75500e7e4b445d13219a27
    (older numbering; matched by content, transcribed below as CAMPAIGN);
  * inference-sim/training default_args/20260217-155451-llama-2-7b-tp1-codegen/{exp-config,profile}.yaml
    @ ed5c1d26900e6909758d5e1641a18edaf56a1caf (read from the mirror) for the one legacy training run.

The campaign files are not in the local mirror (they were read with the search tool's read_file),
so their content is transcribed here rather than re-read.
"""
import csv
import io
import json
import os
import subprocess
import sys

S2R = "/work/.mirror/inference-sim+sim-to-real-accuracy-validation/repo"
TRAINING = "/work/.mirror/inference-sim+training/repo"
TEST = ("7f3b27022dcd575958a2f0c7b2373afece64c655", "results_iter36/error_records.csv")
TRAIN = ("dcec3fd4711c761ac16557db720d1856b604579c", "results_trainval/error_records.csv")
TRAINING_COMMIT = "ed5c1d26900e6909758d5e1641a18edaf56a1caf"
LEGACY = "20260217-155451-llama-2-7b-tp1-codegen"

TEKTONC = "inference-sim/tektonc-data-collection"
C_OLD = "bc8f22902803b99db17c60417db959797a36ec8d"
C_NEW = "0f7f91c9434483286f75500e7e4b445d13219a27"
C_MANIFEST = "c3a09fb949f31431dc71444f485f73e8ce1ffc97"
C_WORKLOADS = "2a7cbcd4e2338cad6d6cb2d9f119728ecd0d4fbd"
C_BASEVALUES = "00596a6196a0cfc849fa33d6ee3a4a13a27fbdb0"
C_GENERATE = "00596a6196a0cfc849fa33d6ee3a4a13a27fbdb0"

# workloads.yaml @ 2a7cbcd (tektonc-data-collection); field names as in inference-perf's
# shared_prefix config (num_unique_system_prompts == num_groups,
# num_users_per_system_prompt == num_prompts_per_group).
PRESETS = {
    "general":        dict(groups=9,  per_group=5, sys=100, q=447, out=248, stages=[(8.0, 600), (20.0, 600)]),
    "codegen":        dict(groups=11, per_group=4, sys=100, q=466, out=247, stages=[(5.0, 600), (10.0, 600)]),
    "roleplay":       dict(groups=10, per_group=5, sys=150, q=600, out=251, stages=[(6.0, 1200)]),
    "reasoning":      dict(groups=23, per_group=1, sys=100, q=934, out=1448, stages=[(4.0, 1200)]),
    "general-lite":   dict(groups=9,  per_group=5, sys=100, q=447, out=248, stages=[(2.5, 600), (6.0, 600)]),
    "reasoning-lite": dict(groups=23, per_group=1, sys=100, q=934, out=1448, stages=[(1.0, 1200)]),
}

# HF ids -> model keys of models.toml
MODEL_KEYS = {
    "codellama/CodeLlama-34b-Instruct-hf": "codellama-34b",
    "meta-llama/Llama-2-70b-hf": "llama-2-70b",
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "Qwen/Qwen3-14B": "qwen3-14b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "mistralai/Mixtral-8x22B-Instruct-v0.1": "mixtral-8x22b",
    "mistralai/Mixtral-8x22B-v0.1": "mixtral-8x22b",
    "RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic": "llama-4-scout-fp8",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "mistralai/Mistral-Nemo-Instruct-2407": "mistral-nemo-12b",
    "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b",
    "01-ai/Yi-34B": "yi-34b",
    "meta-llama/Llama-2-7b-hf": "llama-2-7b",
}
GPU_KEYS = {"H100": "H100-80GB-SXM", "A100-80GB": "A100-80GB-SXM", "L40S": "L40S"}

# Manifest (experiments.json @ c3a09fb): observability flag and notes, by experiment id.
# observability=true selects values-observability.yaml, whose image is ghcr.io/inference-sim/vllm:0.15.1
# (tracing build; tektoncsample/blis-inference-perf/values-observability.yaml @ 4752c282); otherwise
# vllm/vllm-openai:v0.15.1 (values.yaml @ 00596a6).
MANIFEST = {
    2: (True, "completed"), 3: (True, "completed"), 6: (True, "completed"), 7: (True, "completed"),
    9: (True, "completed"), 10: (True, "completed"), 11: (True, "completed"),
    13: (False, "completed"), 14: (False, "completed"), 15: (False, "completed"), 16: (False, "completed"),
    17: (False, "completed; pre-quantized FP8 (RedHatAI); manifest done=false"),
    18: (False, "completed"), 19: (False, "completed"),
    20: (False, "completed; pre-quantized FP8 (RedHatAI)"), 21: (False, "completed; pre-quantized FP8 (RedHatAI)"),
    22: (False, "completed; mbt sweep"), 23: (False, "completed; mbt sweep"),
    24: (False, "completed; cpu_offload sweep"), 25: (False, "completed; gpu_mem sweep"),
    26: (False, "completed; TP sweep (2x default)"), 27: (False, "mbt sweep"),
    28: (False, "completed; mbt sweep"), 29: (False, "completed; cpu_offload sweep"),
    30: (False, "completed; gpu_mem sweep"), 31: (False, "completed; TP sweep (2x default)"),
    36: (False, "manifest: workload general, 'Unsafe (13.6 < 20 rps); 19.039 ms/token', done=false; folder and records say general-lite"),
    38: (False, "manifest: '10.833 ms/token', done=false"),
    40: (False, "manifest: workload general, 'Unsafe (10.9 < 20 rps); 23.598 ms/token', done=false; folder and records say general-lite"),
    41: (False, "manifest: workload general, 'Unsafe (9.0 < 20 rps); 28.783 ms/token', done=false; folder and records say general-lite"),
    46: (False, "completed; deprioritized"),
    48: (True, "completed; deprioritized; pre-quantized FP8 (RedHatAI); manifest cpu_offload=true, done=false"),
    49: (False, "completed"), 50: (False, "completed"), 51: (False, "completed"),
    53: (False, "completed; manifest done=false"),
    54: (False, "completed"), 55: (False, "completed"),
    56: (False, "Default-config baseline (Phase 0 row 9 used cpu_offload=Enabled)"),
    57: (False, "Default-config baseline (Phase 0 row 1 used cpu_offload=Enabled); General-Lite (6 rps peak) for safe rate; manifest done=false"),
    58: (False, "Default-config baseline (Phase 0 row 5 used cpu_offload=Enabled); General-Lite (6 rps peak) for safe rate"),
    59: (False, "Matches A100/L40S workload for consistent Figure 2 hardware comparison"),
    60: (True, ""), 61: (True, ""), 62: (True, ""), 63: (True, ""), 64: (True, ""), 65: (True, ""),
    66: (True, "manifest cpu_offload=true, gpu_mem=0.9, notes: 'Reduced gpu_mem to 0.75 due to GPU memory contention'"),
    67: (True, "manifest cpu_offload=true, gpu_mem=0.9, notes: 'Reduced gpu_mem to 0.75 with cpu_offload for lower GPU memory pressure'"),
}
# Manifest values the training error records leave blank (cpu_offload, gpu_mem).
TRAIN_MANIFEST = {
    17: (False, 0.9), 20: (False, 0.9), 21: (False, 0.9), 48: (True, 0.9),
    60: (False, 0.9), 61: (False, 0.9), 62: (False, 0.9), 63: (False, 0.9), 64: (False, 0.9),
    65: (False, 0.9), 66: (True, 0.9), 67: (True, 0.9),
}

# Campaign folder matched to each record id: (folder, commit, files read, match, note).
# match: "exact"    = values.yaml/experiment.json agree with the records on model, hw, tp, mbt,
#                     cpu_offload, gpu_mem, workload (hence stage count);
#        "config"   = agree on everything but the workload or checkpoint: the run in the records is a
#                     later re-run whose folder is not in the index; workload taken from the folder name;
#        "none"     = no campaign folder indexed; everything from the records + manifest + presets.
CAMPAIGN = {
    2: ("2-codellama-34b-h100-codegen", C_OLD, "values.yaml", "exact", ""),
    3: ("3-codellama-34b-h100-roleplay", C_OLD, "values.yaml,experiment.json", "exact", ""),
    6: ("6-llama-2-70b-h100-codegen", C_OLD, "values.yaml", "exact", ""),
    7: ("7-llama-2-70b-h100-roleplay", C_OLD, "values.yaml", "exact", ""),
    9: ("9-mixtral-8x7b-h100-general", C_OLD, "values.yaml", "exact", ""),
    10: ("10-mixtral-8x7b-h100-codegen", C_OLD, "experiment.json", "exact", ""),
    11: ("11-mixtral-8x7b-h100-roleplay", C_OLD, "experiment.json", "exact", ""),
    13: ("13-qwen3-14b-h100-general", C_NEW, "experiment.json", "exact", ""),
    14: ("14-qwen3-14b-h100-codegen", C_NEW, "experiment.json", "exact", ""),
    15: ("15-qwen3-14b-h100-roleplay", C_NEW, "experiment.json", "exact", ""),
    16: ("16-llama-3-1-8b-h100-general", C_NEW, "values.yaml", "exact", ""),
    18: ("19-llama-3-1-8b-h100-codegen", C_NEW, "experiment.json", "exact", "campaign #19 = record #18"),
    19: ("20-llama-3-1-8b-h100-roleplay", C_NEW, "experiment.json", "exact", "campaign #20 = record #19"),
    22: ("25-llama-3-1-8b-h100-general", C_NEW, "experiment.json", "exact", "campaign #25 = record #22 (mbt 1024)"),
    23: ("26-llama-3-1-8b-h100-general", C_NEW, "experiment.json", "exact", "campaign #26 = record #23 (mbt 8192)"),
    24: ("27-llama-3-1-8b-h100-general", C_NEW, "values.yaml,experiment.json", "exact", "campaign #27 = record #24 (cpu_offload)"),
    25: ("28-llama-3-1-8b-h100-general", C_NEW, "experiment.json", "exact", "campaign #28 = record #25 (gpu_mem 0.95)"),
    26: ("29-llama-3-1-8b-h100-general", C_NEW, "experiment.json", "exact", "campaign #29 = record #26 (tp 2)"),
    27: ("30-mixtral-8x7b-h100-general", C_NEW, "experiment.json", "config", "campaign #30 has mbt 1024 but workload general; the records' run is general-lite (folder 27-...-general-lite-2-1; manifest c3a09fb says general-lite). LLMServingSim's matched file still names the older folder 27-mixtral-8x7b-tp2-general-2"),
    28: ("31-mixtral-8x7b-h100-general", C_NEW, "experiment.json", "exact", "campaign #31 = record #28 (mbt 8192)"),
    29: ("32-mixtral-8x7b-h100-general", C_NEW, "experiment.json", "exact", "campaign #32 = record #29 (cpu_offload)"),
    30: ("33-mixtral-8x7b-h100-general", C_NEW, "experiment.json", "exact", "campaign #33 = record #30 (gpu_mem 0.95)"),
    31: ("34-mixtral-8x7b-h100-general", C_NEW, "experiment.json", "exact", "campaign #34 = record #31 (tp 4)"),
    36: ("39-qwen3-14b-a100-80gb-general", C_NEW, "values.yaml", "config", "campaign #39 (A100-SXM4-80GB) is workload general (8/20 rps); the records' run is general-lite"),
    38: ("41-llama-3-1-8b-a100-80gb-general", C_NEW, "experiment.json", "config", "campaign #41 is workload general; the records' run is general-lite"),
    40: ("43-codellama-34b-a100-80gb-general", C_NEW, "experiment.json", "config", "campaign #43 is workload general; the records' run is general-lite"),
    41: ("44-llama-2-70b-a100-80gb-general", C_NEW, "experiment.json", "config", "campaign #44 is workload general; the records' run is general-lite"),
    46: ("50-llama-3-1-8b-h100-reasoning", C_NEW, "experiment.json", "exact", "campaign #50 = record #46"),
    54: ("40-qwen3-14b-l40s-general", C_NEW, "values.yaml", "config", "campaign #40 (NVIDIA-L40S) is workload general; the records' run is general-lite"),
    55: ("42-llama-3-1-8b-l40s-general", C_NEW, "experiment.json", "config", "campaign #42 is workload general; the records' run is general-lite"),
    17: ("18-llama-4-scout-17b-16e-h100-general", C_NEW, "values.yaml", "config", "campaign #18 quantizes meta-llama/Llama-4-Scout-17B-16E online (--quantization fp8) with workload general; the records' run uses the RedHatAI FP8-dynamic checkpoint and general-lite"),
    20: ("23-llama-4-scout-17b-16e-h100-codegen", C_NEW, "experiment.json", "config", "campaign #23 = record #20 by content; checkpoint probably online-FP8 there, RedHatAI in the records"),
    21: ("24-llama-4-scout-17b-16e-h100-roleplay", C_NEW, "(listed only)", "config", "campaign #24 = record #21 by name; not read"),
    48: ("53-llama-4-scout-17b-16e-h100-reasoning", C_NEW, "experiment.json", "config", "campaign #53 is workload reasoning (4 rps), cpu_offload false; the records' run is reasoning-lite (1 rps) and the manifest says cpu_offload true"),
}

KV_OFFLOAD_BYTES = 8 * 1024**3      # generate.py @ 00596a6: --kv-offloading-size=8.0 (GiB, total across TP ranks)
WEIGHT_OFFLOAD_BYTES = 4 * 1024**3  # campaign values.yaml @ bc8f229/0f7f91c: --cpu-offload-gb 4 (per GPU)


def git_show(repo, commit, path):
    return subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def load_records():
    out = {}
    for set_name, (commit, path) in (("test", TEST), ("train", TRAIN)):
        for r in csv.DictReader(io.StringIO(git_show(S2R, commit, path))):
            f = r["experiment_folder"].rstrip("/").split("/")[-1]
            e = out.setdefault(f, {"set": set_name, "row": r, "stages": set(), "sims": set()})
            e["stages"].add(int(r["stage_index"]))
            e["sims"].add(r["simulator"])
    return out


def workload_of(folder):
    # "<id>-<model>-tp<N>-<workload>[-<tp>[-<dp>]]"
    tail = folder.split("-tp", 1)[1].split("-", 1)[1]
    for w in sorted(PRESETS, key=len, reverse=True):
        if tail == w or tail.startswith(w + "-"):
            return w
    raise ValueError(folder)


def q(s):
    return json.dumps(s)


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return q(v)


def main():
    recs = load_records()
    # the legacy training run's own config files
    legacy_cfg = git_show(TRAINING, TRAINING_COMMIT, f"default_args/{LEGACY}/exp-config.yaml")
    legacy_profile = json.loads(git_show(TRAINING, TRAINING_COMMIT, f"default_args/{LEGACY}/profile.yaml"))
    legacy_sp = legacy_profile["data"]["shared_prefix"]

    def key(f):
        h = f.split("-")[0]
        return (recs[f]["set"] != "test", len(h) >= 8, int(h))

    lines = [
        "# Sim-to-real benchmark experiments (BLIS sim-to-real-accuracy-validation, vLLM v0.15.1).",
        "# Generated by scripts/build_experiments.py; see README.md for sources and caveats.",
        "# Units: rates in requests/s, durations in s, lengths in tokens, memory in bytes.",
        "",
        "schema = 1",
        "",
    ]
    n = {"test": 0, "train": 0}
    for f in sorted(recs, key=key):
        e = recs[f]
        r = e["row"]
        set_name = e["set"]
        n[set_name] += 1
        legacy = f == LEGACY
        eid = int(float(r["exp_id"]))
        wl = workload_of(f) if not legacy else "codegen"
        p = PRESETS[wl]
        stages = p["stages"]
        if legacy:
            stages = [(float(s["rate"]), int(s["duration"])) for s in legacy_profile["load"]["stages"]]
            assert (legacy_sp["num_unique_system_prompts"], legacy_sp["num_users_per_system_prompt"],
                    legacy_sp["system_prompt_len"], legacy_sp["question_len"], legacy_sp["output_len"]) == \
                   (p["groups"], p["per_group"], p["sys"], p["q"], p["out"]), "legacy profile != codegen preset"
            assert "max_model_len: 4096" in legacy_cfg and "max_num_seqs: 128" in legacy_cfg
        per_stage = sorted(s for s in e["stages"] if s >= 0)
        if len(per_stage) != len(stages):
            sys.exit(f"{f}: records have stages {per_stage}, preset {wl} has {len(stages)}")
        tp = int(float(r["tp"]))
        dp = int(float(r["dp"])) if r["dp"] else 1
        mbt = int(float(r["max_num_batched_tokens"]))
        if set_name == "test":
            cpu_offload = r["cpu_offload"] == "True"
            gpu_mem = float(r["gpu_mem_util"])
        elif legacy:
            cpu_offload, gpu_mem = False, 0.9
        else:
            cpu_offload, gpu_mem = TRAIN_MANIFEST[eid]
        obs, mnote = MANIFEST.get(eid, (False, ""))
        camp = CAMPAIGN.get(eid) if not legacy else None
        notes = []
        if camp and camp[4]:
            notes.append(camp[4])
        if camp and camp[1] == C_OLD and obs:
            notes.append("vLLM image uncertain: campaign values.yaml @ bc8f229 uses vllm/vllm-openai:v0.15.1 "
                         "(no tracing); manifest c3a09fb marks observability=true (tracing build "
                         "ghcr.io/inference-sim/vllm:0.15.1)")
        if set_name == "train" and r["workload"] != wl:
            notes.append(f"training records' workload column says '{r['workload']}'; folder name says '{wl}'")
        if mnote:
            notes.append("manifest note: " + mnote)
        if cpu_offload:
            notes.append("cpu_offload semantics ambiguous: campaign values.yaml (bc8f229/0f7f91c) pass "
                         "'--cpu-offload-gb 4' (weight offload, 4 GiB per GPU); generate.py @ 00596a6 passes "
                         "'--kv-offloading-size=8.0 --disable-hybrid-kv-cache-manager' (8 GiB KV offload); "
                         "the measured ITL equals the non-offload twins, so no weight streaming is visible")
        if wl.startswith("reasoning"):
            notes.append("multi-turn context (100 + rounds x (934+1448)) exceeds max_model_len 4096 from the 2nd round")
        if r["model"] == "mistralai/Mixtral-8x22B-v0.1":
            notes.append("records name the base checkpoint Mixtral-8x22B-v0.1 (models.yaml @ 00596a6 maps "
                         "Mixtral-8x22B to the Instruct checkpoint); same architecture")
        if not camp and not legacy:
            notes.append("no campaign folder indexed for this id: workload from folder name + workloads.yaml preset")
        src = {
            "records": f"inference-sim/sim-to-real-accuracy-validation@{TEST[0] if set_name == 'test' else TRAIN[0]}:"
                       f"{TEST[1] if set_name == 'test' else TRAIN[1]}",
            "workload": (f"inference-sim/training@{TRAINING_COMMIT}:default_args/{LEGACY}/profile.yaml" if legacy
                         else f"{TEKTONC}@{C_WORKLOADS}:workloads.yaml#{wl}"),
            "vllm_defaults": (f"inference-sim/training@{TRAINING_COMMIT}:default_args/{LEGACY}/exp-config.yaml" if legacy
                              else f"{TEKTONC}@{C_BASEVALUES}:tektoncsample/blis-inference-perf/values.yaml"),
            "manifest": "" if legacy else f"{TEKTONC}@{C_MANIFEST}:blis-campaign/experiments.json#id={eid}",
            "campaign": "" if not camp else f"{TEKTONC}@{camp[1]}:blis-campaign/campaign/{camp[0]}/ ({camp[2]})",
        }
        match = "profile" if legacy else (camp[3] if camp else "none")
        ex = [
            ("id", eid), ("folder", f), ("set", set_name),
            ("model", MODEL_KEYS[r["model"]]), ("hf_id", r["model"]),
            ("gpu", GPU_KEYS[r["hardware"]]), ("tp", tp), ("dp", dp),
            ("precision", r["precision"]),
            ("max_num_batched_tokens", mbt), ("max_num_seqs", 128), ("max_model_len", 4096),
            ("gpu_memory_utilization", gpu_mem),
            ("cpu_offload", cpu_offload),
            ("kv_offload_bytes", KV_OFFLOAD_BYTES if cpu_offload else 0),
            ("weight_offload_bytes_per_gpu_alt", WEIGHT_OFFLOAD_BYTES if cpu_offload else 0),
            ("prefix_caching", True), ("chunked_prefill", True),
            ("vllm_image", "ghcr.io/inference-sim/vllm:0.15.1" if obs else "vllm/vllm-openai:v0.15.1"),
            ("match", match),
            ("simulators", sorted(e["sims"])),
            ("notes", notes),
        ]
        lines.append("[[experiments]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in ex]
        lines.append("")
        lines.append("[experiments.workload]")
        wlv = [("preset", wl), ("type", "shared_prefix"), ("num_groups", p["groups"]),
               ("prompts_per_group", p["per_group"]), ("system_prompt_len", p["sys"]),
               ("question_len", p["q"]), ("output_len", p["out"]), ("multi_turn", True),
               ("ignore_eos", True), ("api", "completion"), ("streaming", True), ("load", "constant")]
        lines += [f"{k} = {toml_value(v)}" for k, v in wlv]
        lines.append("stages = [" + ", ".join(f"{{ rate = {a!r}, duration_s = {d} }}" for a, d in stages) + "]")
        lines.append("")
        lines.append("[experiments.source]")
        lines += [f"{k} = {q(v)}" for k, v in src.items()]
        lines.append("")
    out = os.path.join(os.path.dirname(__file__), "..", "experiments.toml")
    with open(out, "w") as fh:
        fh.write("\n".join(lines))
    print(f"experiments.toml: {n['test']} test + {n['train']} training experiments", file=sys.stderr)


if __name__ == "__main__":
    main()
