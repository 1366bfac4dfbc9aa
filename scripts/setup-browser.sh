#!/usr/bin/env bash
# Make sure the browser test can run: Debian's chromium and Playwright for Python.
# Idempotent; safe to call before every test run. Playwright never downloads a browser
# here: the test points it at /usr/bin/chromium.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"

if ! command -v chromium >/dev/null 2>&1; then
    echo "setup-browser: installing Debian's chromium" >&2
    if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

if ! "$PYTHON" -c "import playwright.sync_api" >/dev/null 2>&1; then
    echo "setup-browser: installing playwright for Python" >&2
    "$PYTHON" -m pip install -q "playwright>=1.45"
fi

chromium --version 2>/dev/null || true
