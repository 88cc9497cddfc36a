"""CPU time of ``qsim.run`` of the FMAPI experiment against the CLI's
``qsim run`` (same file, seeds): the child process's CPU seconds for the
CLI, this process's for the library (the import excluded). Median of 5.
Run: QSIM=path/to/qsim ~/.cache/qsim-venv/bin/python python/bench/run_vs_cli.py [SEEDS]"""

import os
import resource
import statistics
import subprocess
import sys
import time

import qsim

SEEDS = sys.argv[1] if len(sys.argv) > 1 else "200"
QSIM = os.environ.get("QSIM") or os.path.expanduser("~/.cache/qsim-target/release/qsim")
FMAPI = "builtin:experiments/fmapi-pacing.toml"


def cli_cpu():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([QSIM, "run", FMAPI, "--seeds", SEEDS], check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def lib_cpu():
    t = time.process_time()
    qsim.run(FMAPI, seeds=int(SEEDS))
    return time.process_time() - t


cli = [cli_cpu() for _ in range(5)]
lib = [lib_cpu() for _ in range(5)]
c, l = statistics.median(cli), statistics.median(lib)
print(f"qsim run --seeds {SEEDS}: CLI {c:.3f} CPU-s, qsim.run {l:.3f} CPU-s ({100 * (l / c - 1):+.1f} %)")
