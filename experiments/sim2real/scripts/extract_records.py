#!/usr/bin/env python3
"""Regenerate actuals.csv and published.csv from the sim-to-real study's error records.

Sources (read with `git show`, python3 stdlib only):
  inference-sim/sim-to-real-accuracy-validation
    7f3b27022dcd575958a2f0c7b2373afece64c655:results_iter36/error_records.csv   (38 test experiments)
    dcec3fd4711c761ac16557db720d1856b604579c:results_trainval/error_records.csv (13 training experiments)
    dcec3fd4711c761ac16557db720d1856b604579c:results/llmservingsim_error_records_matched.csv

Usage: python3 scripts/extract_records.py [--repo PATH] [--out DIR] [--medians]
"""
import argparse
import collections
import csv
import io
import os
import statistics
import subprocess
import sys

REPO = "/work/.mirror/inference-sim+sim-to-real-accuracy-validation/repo"
TEST = ("7f3b27022dcd575958a2f0c7b2373afece64c655", "results_iter36/error_records.csv")
TRAIN = ("dcec3fd4711c761ac16557db720d1856b604579c", "results_trainval/error_records.csv")
LSS = ("dcec3fd4711c761ac16557db720d1856b604579c", "results/llmservingsim_error_records_matched.csv")

METRICS = ["e2e_mean", "e2e_p90", "e2e_p99", "ttft_mean", "ttft_p90", "ttft_p99", "itl_mean"]
EXP_COLS = ["model", "hardware", "tp", "dp", "precision", "cpu_offload", "gpu_mem_util",
            "max_num_batched_tokens", "workload"]


def load(repo, commit, path):
    text = subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"],
                          check=True, capture_output=True, text=True).stdout
    return list(csv.DictReader(io.StringIO(text)))


def folder(r):
    return r["experiment_folder"].rstrip("/").split("/")[-1]


def intish(s):
    """'2.0' -> '2'; '' stays ''."""
    if s in ("", None):
        return ""
    f = float(s)
    return str(int(f)) if f == int(f) else s


def exp_key(f):
    head = f.split("-")[0]
    return (0, int(head), f) if len(head) < 8 else (1, int(head), f)


def stage_key(s):
    # per-stage rows first (0, 1, ...), whole-run summary (-1) last
    i = int(s)
    return (1, 0) if i == -1 else (0, i)


def actual_rows(rows, set_name):
    seen = {}
    for r in rows:
        k = (folder(r), r["stage_index"], r["metric_name"])
        a = float(r["actual"])
        if k in seen and abs(seen[k]["actual_ms"] - a) > 1e-9 * max(1.0, abs(a)):
            sys.exit(f"inconsistent actual for {k}: {seen[k]['actual_ms']} vs {a}")
        if k not in seen:
            row = {"set": set_name, "exp_id": intish(r["exp_id"]), "folder": folder(r),
                   "stage_index": r["stage_index"], "metric": r["metric_name"], "actual_ms": a}
            for c in EXP_COLS:
                row[c] = intish(r[c]) if c in ("tp", "dp", "max_num_batched_tokens") else r[c]
            seen[k] = row
    out = list(seen.values())
    out.sort(key=lambda x: (exp_key(x["folder"]), stage_key(x["stage_index"]),
                            METRICS.index(x["metric"])))
    return out


def published_rows(rows, set_name):
    out = []
    for r in rows:
        out.append({"simulator": r["simulator"], "set": set_name, "exp_id": intish(r["exp_id"]),
                    "folder": folder(r), "stage_index": r["stage_index"],
                    "metric": r["metric_name"], "predicted_ms": float(r["predicted"]),
                    "actual_ms": float(r["actual"]), "ape_pct": float(r["mape"])})
    out.sort(key=lambda x: (x["simulator"], exp_key(x["folder"]), stage_key(x["stage_index"]),
                            METRICS.index(x["metric"])))
    return out


def fmt(v):
    return repr(v) if isinstance(v, float) else str(v)


def write(path, rows, cols):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(cols)
        for r in rows:
            w.writerow([fmt(r[c]) for c in cols])


def medians(pub):
    """Median APE per simulator on the test set, computed three ways."""
    sims = sorted({r["simulator"] for r in pub if r["set"] == "test"})
    lines = ["| simulator | exps | A: all rows (stages + summary) e2e/ttft/itl | "
             "B: per-stage rows, median over exps of per-exp mean e2e/ttft/itl | "
             "C: summary rows (stage -1) e2e/ttft/itl |",
             "|---|---|---|---|---|"]
    for s in sims:
        R = [r for r in pub if r["set"] == "test" and r["simulator"] == s]
        exps = len({r["folder"] for r in R})
        cells = []
        for how in "ABC":
            vals = []
            for m in ("e2e_mean", "ttft_mean", "itl_mean"):
                M = [r for r in R if r["metric"] == m]
                if how == "A":
                    xs = [r["ape_pct"] for r in M]
                elif how == "B":
                    per = collections.defaultdict(list)
                    for r in M:
                        if r["stage_index"] != "-1":
                            per[r["folder"]].append(r["ape_pct"])
                    xs = [statistics.mean(v) for v in per.values()]
                else:
                    xs = [r["ape_pct"] for r in M if r["stage_index"] == "-1"]
                vals.append(f"{statistics.median(xs):.1f}" if xs else "-")
            cells.append(" / ".join(vals))
        lines.append(f"| {s} | {exps} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=REPO)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--medians", action="store_true", help="print the median-APE table")
    a = ap.parse_args()
    test = load(a.repo, *TEST)
    train = load(a.repo, *TRAIN)
    lss = load(a.repo, *LSS)
    acts = actual_rows(test, "test") + actual_rows(train, "train")
    write(os.path.join(a.out, "actuals.csv"), acts,
          ["set", "exp_id", "folder"] + EXP_COLS + ["stage_index", "metric", "actual_ms"])
    pub = published_rows(test, "test") + published_rows(lss, "test") + published_rows(train, "train")
    write(os.path.join(a.out, "published.csv"), pub,
          ["simulator", "set", "exp_id", "folder", "stage_index", "metric",
           "predicted_ms", "actual_ms", "ape_pct"])
    print(f"actuals.csv: {len(acts)} rows; published.csv: {len(pub)} rows", file=sys.stderr)
    if a.medians:
        print(medians(pub))


if __name__ == "__main__":
    main()
