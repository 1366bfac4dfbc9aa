#!/usr/bin/env bash
# Make sure the admin browser test can run: Debian's chromium (Playwright for Python comes
# with the dev extra). Idempotent. Playwright never downloads a browser here: the test
# points it at /usr/bin/chromium.
set -euo pipefail

if ! command -v chromium >/dev/null 2>&1; then
    echo "setup-browser: installing Debian's chromium" >&2
    if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
chromium --version 2>/dev/null || true
