#!/usr/bin/env bash
# Runs the notebooks the way a reader would, on a fresh machine: makes their
# inputs with the qsim binary (`--out DIR`: Parquet, CSV, manifest.json under
# notebooks/data/, git-ignored), then executes every notebooks/*.ipynb
# headlessly with nbclient. A notebook cell that fails fails this script (and
# so scripts/test.sh). Executed copies, with their outputs and plots, are left
# in notebooks/data/executed/ (never committed: the notebooks in git carry no
# outputs, which is checked here too).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/qsim-target}"
VENV="${QSIM_VENV:-$HOME/.cache/qsim-venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import polars, matplotlib, nbclient, nbformat, ipykernel' 2>/dev/null; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check polars matplotlib nbclient nbformat ipykernel
fi
"$VENV/bin/python" -c 'import polars, matplotlib, nbclient; print("notebook deps: polars", polars.__version__, "matplotlib", matplotlib.__version__, "nbclient", nbclient.__version__)'

QSIM="${QSIM:-}"
if [ -z "$QSIM" ]; then
  QSIM="$(scripts/qsim-bin.sh)"
fi
export QSIM
# notebooks/pacer-fmapi.ipynb uses the qsim Python package (scripts/py-deps.sh)
if ! "$VENV/bin/python" -c 'import qsim, openai, tenacity' 2>/dev/null; then
  scripts/py-deps.sh
fi
DATA=notebooks/data
rm -rf "$DATA"
mkdir -p "$DATA/executed"
# the reports go to text files beside the tables; only the tables are read
"$QSIM" run experiments/fmapi-pacing.toml --seeds 20 \
  --out "$DATA/fmapi-pacing" > "$DATA/fmapi-pacing.txt"
"$QSIM" plan --scenarios experiments/shared-deployment.toml --seeds 5 \
  --out "$DATA/shared-deployment" > "$DATA/shared-deployment.txt"
"$QSIM" sweep experiments/fmapi-pacing.toml --only exp1-direct,exp2-backoff \
  --vary max_tokens=128,192,256 --vary workers=4..128:x2 --seeds 10 \
  --out "$DATA/sweep" > "$DATA/sweep.txt"

"$VENV/bin/python" - notebooks/*.ipynb <<'PY'
import pathlib, sys, time
import nbformat
from nbclient import NotebookClient

failed = []
for path in map(pathlib.Path, sys.argv[1:]):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    if dirty:
        failed.append(f"{path}: cells {dirty} carry outputs; commit notebooks without outputs")
        continue
    t = time.monotonic()
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    except Exception as e:  # a failing cell: report it, run the others
        failed.append(f"{path}: {type(e).__name__}: {str(e)[-2000:]}")
    nbformat.write(nb, path.parent / "data" / "executed" / path.name)
    print(f"notebook {path}: {'ok' if not failed or not failed[-1].startswith(str(path)) else 'FAILED'} "
          f"({time.monotonic() - t:.1f} s)")
for f in failed:
    print(f, file=sys.stderr)
print(f"notebooks: {len(sys.argv) - 1 - len(failed)} passed, {len(failed)} failed")
sys.exit(1 if failed else 0)
PY
