#!/usr/bin/env bash
# Installs what is missing for ShingleFS, idempotently:
#   1. Debian packages (fuse3, libfuse3-dev, pkg-config, postgresql, iproute2) via apt-get
#      when running as root; otherwise prints the exact command and stops.
#   2. A virtual environment at .venv with shinglefs installed editable and its
#      test extras (torch is pinned to the CPU build that lies on this machine).
# A stamp file makes a second run cheap; it is refreshed when pyproject.toml changes.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(fuse3 libfuse3-dev pkg-config postgresql iproute2)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        echo "setup: installing Debian packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}"
    else
        echo "setup: missing Debian packages: ${missing[*]}" >&2
        echo "setup: run as root:  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi

PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.shinglefs-installed
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV"
    "$PY" -m venv "$VENV"
fi
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
    echo "setup: installing shinglefs and its test extras into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # torch first, pinned, so nothing else pulls a multi-GB CUDA build.
    "$VENV/bin/python" -m pip install -q "torch==2.13.0"
    "$VENV/bin/python" -m pip install -q -e ".[test]"
    touch "$STAMP"
fi
# The package is installed editable, so its bytecode is not compiled by pip; an
# environment with PYTHONDONTWRITEBYTECODE set (CI images often have it) would
# compile every module again in every process: ~0.35 s for each `shinglefs`
# command and mount started (a quarter of the time of the CLI and mount tests).
# compileall writes it whatever that variable says, and only what changed.
"$VENV/bin/python" -m compileall -q src >/dev/null
