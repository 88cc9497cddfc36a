#!/usr/bin/env bash
# Installs the real third-party parts the live proxy tests use (idempotent):
# a Python venv with `llmock` (an OpenAI-compatible mock upstream from PyPI)
# and the official `openai` SDK (the client), and redis-server (Debian). Fails
# loudly if anything is missing.
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
# redis-server (Debian package): the shared limiter state of the multi-replica tests
if ! command -v redis-server >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y redis-server || { $SUDO apt-get update && $SUDO apt-get install -y redis-server; }
fi
command -v redis-server >/dev/null 2>&1 || { echo "live deps: redis-server could not be installed" >&2; exit 1; }
echo "live deps: $(redis-server --version)"
# openssl (Debian package): the TLS upstream test makes its CA and server certificate with it
if ! command -v openssl >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y openssl || { $SUDO apt-get update && $SUDO apt-get install -y openssl; }
fi
command -v openssl >/dev/null 2>&1 || { echo "live deps: openssl could not be installed" >&2; exit 1; }
echo "live deps: $(openssl version)"
