#!/usr/bin/env bash
# Installs the real third-party parts the live proxy tests use (idempotent):
# a Python venv with `llmock` (an OpenAI-compatible mock upstream from PyPI)
# and the official `openai` SDK (the client). Fails loudly if anything is missing.
set -euo pipefail
VENV="${QSIM_VENV:-$HOME/.cache/qsim-venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import llmock, openai' 2>/dev/null; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check llmock openai
fi
"$VENV/bin/python" -c 'import llmock, openai; print("live deps: openai", openai.__version__)'
