#!/usr/bin/env python3
"""The house's size rules (issue 37), checked by scripts/test.sh:

- the binary's src/ keeps argument mapping, rendering and process concerns:
  under 5,000 lines in all, and no file in src/commands/ over 400 lines;
- the libraries every door calls (qsim-core, qsim-sim, qsim-live,
  qsim-api, qsim-results, qsim-plot) name no clap: nothing below the
  command line parses arguments.

Exit 1 and print every breach; exit 0 otherwise.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC_MAX = 5000
COMMAND_MAX = 400
LIBRARIES = ["qsim-core", "qsim-sim", "qsim-live", "qsim-api", "qsim-results", "qsim-plot"]


def rs_files(d):
    for dp, _, fs in os.walk(d):
        for f in fs:
            if f.endswith(".rs"):
                yield os.path.join(dp, f)


def lines(p):
    with open(p, encoding="utf-8") as f:
        return sum(1 for _ in f)


def main():
    bad = []
    src = os.path.join(ROOT, "src")
    total = sum(lines(p) for p in rs_files(src))
    if total >= SRC_MAX:
        bad.append(f"src/ holds {total} lines of Rust, the most is {SRC_MAX - 1}")
    for p in sorted(rs_files(os.path.join(src, "commands"))):
        n = lines(p)
        if n > COMMAND_MAX:
            bad.append(f"{os.path.relpath(p, ROOT)}: {n} lines, the most is {COMMAND_MAX}")
    for lib in LIBRARIES:
        d = os.path.join(ROOT, "crates", lib)
        if not os.path.isdir(d):
            continue
        with open(os.path.join(d, "Cargo.toml"), encoding="utf-8") as f:
            if re.search(r"^\s*clap\s*=", f.read(), re.M):
                bad.append(f"crates/{lib}/Cargo.toml depends on clap")
        for p in rs_files(os.path.join(d, "src")):
            with open(p, encoding="utf-8") as f:
                if re.search(r"\bclap::", f.read()):
                    bad.append(f"{os.path.relpath(p, ROOT)} names clap")
    if bad:
        print("house rules broken:", file=sys.stderr)
        for b in bad:
            print("  " + b, file=sys.stderr)
        return 1
    print(f"house rules: src/ {total} lines; src/commands/ files within {COMMAND_MAX}; libraries without clap")
    return 0


if __name__ == "__main__":
    sys.exit(main())
