#!/usr/bin/env bash
# Builds the qsim Python package (python/: pyo3 + maturin, one abi3 wheel for
# CPython >= 3.9) and installs it, with its test dependencies (pytest,
# hypothesis, tenacity, polars, the openai SDK), into the venv
# ~/.cache/qsim-venv. Idempotent; fails loudly.
#
# The wheel's native module is built in the workspace's target dir
# ($CARGO_TARGET_DIR, release), so after `cargo test --release --workspace`
# only pyo3 and qsim-py compile: crates/qsim-py/Cargo.toml pins the shared
# dependencies' features to the workspace build's, and this script fails if
# the wheel's build compiled qsim-sim again. Wheels go to ~/.cache/qsim-wheels.
#
# On a fresh machine the one command is `pip install ./python` (any venv,
# Rust toolchain needed); this script is the CI's way.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/qsim-target}"
VENV="${QSIM_VENV:-$HOME/.cache/qsim-venv}"
WHEELS="${QSIM_WHEELS:-$HOME/.cache/qsim-wheels}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
need=()
for m in maturin pytest hypothesis tenacity polars openai; do
  "$VENV/bin/python" -c "import $m" 2>/dev/null || need+=("$m")
done
if [ "${#need[@]}" -gt 0 ]; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${need[@]}"
fi
had_sim=0
if compgen -G "$CARGO_TARGET_DIR/release/deps/libqsim_sim-*.rlib" >/dev/null; then had_sim=1; fi
log="$(mktemp)"
mkdir -p "$WHEELS"
rm -f "$WHEELS"/qsim-*.whl
set +e
(cd python && nice -n 5 "$VENV/bin/maturin" build --release --locked \
  --interpreter "$VENV/bin/python" --out "$WHEELS") >"$log" 2>&1
rc=$?
set -e
if [ "$rc" != 0 ]; then
  cat "$log" >&2
  rm -f "$log"
  echo "py deps: the wheel did not build" >&2
  exit "$rc"
fi
if [ "$had_sim" = 1 ] && grep -q "Compiling qsim-sim" "$log"; then
  grep "Compiling" "$log" >&2 || true
  rm -f "$log"
  echo "py deps: the wheel's build compiled qsim-sim again: crates/qsim-py/Cargo.toml's feature pins no longer match the workspace build (cargo tree --workspace -e normal,build,dev -f '{p} {f}')" >&2
  exit 1
fi
grep "Compiling" "$log" || true
rm -f "$log"
wheel="$(ls "$WHEELS"/qsim-*.whl)"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel"
"$VENV/bin/python" -c 'import qsim, polars, openai, tenacity, hypothesis; print("py deps: qsim", qsim.__version__, "wheel", __import__("os").path.basename("'"$wheel"'"), "| polars", polars.__version__, "openai", openai.__version__)'
