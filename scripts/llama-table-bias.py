#!/usr/bin/env python3
"""What reading a decode table as a round's mean ITL does to qsim's
predictions (issue 42; docs/fidelity.md, "The real engine").

Profile A: the llama.cpp profile (models/llama-cpp-tiny-cpu.toml) with the
decode tables of timed single steps (scripts/llama-steps.sh's output: thread
CPU time, what a quiet machine's wall time is). The script asks qsim
itself what the old measurement (tests/it/engine.rs before issue 42: b
requests ~1 ms apart, the round's mean ITL) would have read on an engine
that is A: the later requests' prompt steps land among the earlier ones'
gaps. Profile B carries those tables. Both predict 400-request Poisson
benchmarks of the engine tests' length mix at 20 to 120 % of A's
saturation (`qsim calibrate server --fit none --recorded-arrivals`), and
B's error against A is printed. No wall clock is read: every figure is the
simulator's, on measured CPU-time tables.

Usage: scripts/llama-table-bias.py STEPS_OUTPUT [QSIM]
"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile

steps = open(sys.argv[1]).read()
qsim = sys.argv[2] if len(sys.argv) > 2 else "qsim"
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
base = open(os.path.join(root, "models/llama-cpp-tiny-cpu.toml")).read()
table = lambda L: [float(re.search(rf"decode L={L} D={d} cpu_ms=([\d.]+)", steps).group(1)) for d in range(1, 9)]
short, long_ = table(16), table(384)
tmp = tempfile.mkdtemp(prefix="qsim-table-bias-")
path = lambda n: os.path.join(tmp, n)


def profile(name, s, l):
    fmt = lambda xs: ", ".join("%.4f" % x for x in xs)
    text = base.replace(
        "\n[iteration]\n",
        "\n[iteration]\ndecode_step_ms = [%s]\ndecode_step_context = 48\n"
        "decode_step_ms_long = [%s]\ndecode_step_context_long = 416\n" % (fmt(s), fmt(l)),
        1,
    )
    open(path(name), "w").write(text)


def bench(name, arrivals, lens):
    json.dump({"request_rate": 1.0, "completed": len(lens), "mean_ttft_ms": 1, "mean_itl_ms": 1,
               "mean_e2el_ms": 1, "input_lens": [l[0] for l in lens],
               "output_lens": [l[1] for l in lens], "arrival_s": arrivals}, open(path(name), "w"))


def predict(name, files):
    o = subprocess.run([qsim, "calibrate", "server", "--profile", path(name), "--fit", "none",
                        "--recorded-arrivals", "--format", "json", *map(path, files)],
                       capture_output=True, text=True)
    if o.returncode != 0:
        sys.exit(o.stderr)
    return json.loads(o.stdout)


profile("A.toml", short, long_)
rng = random.Random(1)
rounds = []
for L in (16, 384):
    for b in range(1, 9):
        t, arr = 0.0, []
        for _ in range(b):
            arr.append(t)
            t += rng.expovariate(1000.0)
        bench(f"round-{L}-{b}.json", arr, [(L, 64)] * b)
        rounds.append(f"round-{L}-{b}.json")
mean_itl = [x["fitted"]["itl_ms"] for x in predict("A.toml", rounds)["fit"]]
print("decode step (ms), b = 1..8: the table | a round's mean ITL on it")
print(" context 48: ", " ".join("%.2f|%.2f" % p for p in zip(short, mean_itl[:8])))
print(" context 416:", " ".join("%.2f|%.2f" % p for p in zip(long_, mean_itl[8:])))
profile("B.toml", mean_itl[:8], mean_itl[8:])
bench("burst.json", [0.0] * 48, [(rng.randint(64, 192), rng.randint(16, 48)) for _ in range(48)])
R = predict("A.toml", ["burst.json"])["saturation_rps"]["fitted"]
fracs = (0.2, 0.4, 0.55, 0.75, 1.0, 1.2)
for f in fracs:
    t, arr, lens = 0.0, [], []
    for _ in range(400):
        arr.append(t)
        t += rng.expovariate(f * R)
        lens.append((rng.randint(64, 192), rng.randint(16, 48)))
    bench(f"load-{f}.json", arr, lens)
files = [f"load-{f}.json" for f in fracs]
pa, pb = (predict(p, files)["fit"] for p in ("A.toml", "B.toml"))
print(f"saturation of A: {R:.2f} req/s; B (tables from the mean ITL) against A:")
for f, a, b in zip(fracs, pa, pb):
    e = lambda m: 100 * (b["fitted"][m] / a["fitted"][m] - 1)
    print(f" {int(f * 100):3d} % of R: TTFT {e('ttft_ms'):+5.1f} %, ITL {e('itl_ms'):+5.1f} %, E2E {e('e2e_ms'):+5.1f} %")
