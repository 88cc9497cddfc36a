#!/usr/bin/env bash
# Regenerate the tables of docs/fidelity.md (between the GENERATED markers)
# from experiments/llama-8b-fidelity.toml and experiments/llama-8b-vllm-blis.toml,
# the measured points in experiments/data/llama-8b-fidelity-measured.toml and
# experiments/data/llama-8b-vllm-blis-measured.toml, the saturation runs of
# experiments/llama-8b-vllm-guidellm-sat.toml against
# experiments/data/llama-8b-vllm-guidellm-measured.toml, and experiments/nim-load.toml,
# and check the held-out errors against the thresholds (tests/server_fidelity.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/qsim-target}"
QSIM_FIDELITY_OUT="$PWD/docs/fidelity.md" \
  cargo test --release --locked --workspace --test it -- server_fidelity:: --nocapture
