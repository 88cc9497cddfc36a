#!/usr/bin/env bash
# Mutation testing of the I/O-free core (crates/qsim-core) with cargo-mutants
# (install: cargo install --locked cargo-mutants). Not run in CI: it builds
# and tests every mutant in turn (about 630 mutants; see docs/testing.md for
# the running time on the shared 2-core machine).
#
# Each mutant rebuilds only qsim-core and qsim-core-tests (the core's unit
# tests plus the property tests and reference models), in the dev profile,
# one job at a time. The surviving mutants are in mutants.out/missed.txt;
# every one must be killed by a test or listed as equivalent in
# docs/testing.md.
#
# Extra arguments go to cargo-mutants, e.g. `scripts/mutants.sh -f
# crates/qsim-core/src/limiter/bucket.rs` or `--list`.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo-mutants >/dev/null; then
    echo "cargo-mutants is not installed: cargo install --locked cargo-mutants" >&2
    exit 2
fi
# builds apart from the test suite's target directory
export CARGO_TARGET_DIR="${QSIM_MUTANTS_TARGET:-$HOME/.cache/qsim-target-mutants}"
export CARGO_TERM_COLOR=never
exec cargo mutants \
    --package qsim-core \
    --test-package qsim-core \
    --test-package qsim-core-tests \
    --jobs 1 \
    --timeout 30 \
    --output . \
    "$@"
