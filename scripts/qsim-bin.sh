#!/usr/bin/env bash
# Builds the `qsim` binary the way the test command does and prints its
# path. `cargo test --release --workspace --no-run` resolves the
# workspace's features once (dev-dependencies included); a plain `cargo
# build --bin qsim` resolves fewer and compiles polars a second time (11 min
# on two cores). After scripts/test.sh's own build this builds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/qsim-target}"
cargo test --release --locked --workspace --no-run --quiet >&2
echo "$CARGO_TARGET_DIR/release/qsim"
