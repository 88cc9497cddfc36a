#!/usr/bin/env bash
# Re-run the fit of the vLLM v0.15.1 bf16 Llama-3.1-8B profile's two engine
# coefficients (bandwidth_efficiency, compute_efficiency of
# models/llama-3.1-8b-h100-vllm.toml and its -blis copy): least squares on the
# relative mean ITL and mean TTFT of the `use = "fit"` points of
# experiments/data/llama-8b-vllm-blis-measured.toml (BLIS experiments 23 and
# 25), each run by a copy of the BLIS profile with that run's flags. Prints
# the grid, the fitted values, the fit errors and the shipped values;
# `tests/server_fidelity.rs` (vllm_profile_is_the_fit) checks they agree.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/qsim-target}"
cargo test --release --locked --workspace --test it -- --ignored server_fidelity::fit_vllm_8b --nocapture
