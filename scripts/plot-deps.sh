#!/usr/bin/env bash
# Installs what the HTML report's browser test uses (idempotent): Chromium
# from Debian (/usr/bin/chromium), run headless by tests/plots_html.rs.
# Fails loudly if it cannot be installed.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y chromium || { $SUDO apt-get update && $SUDO apt-get install -y chromium; }
fi
command -v chromium >/dev/null 2>&1 || { echo "plot deps: chromium could not be installed" >&2; exit 1; }
echo "plot deps: $(chromium --version 2>/dev/null)"
