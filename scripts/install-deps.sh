#!/usr/bin/env bash
# Install what building and testing quantspec needs: Debian -dev packages and Python test tooling.
# Idempotent: skips apt-get when everything is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PACKAGES=(build-essential cmake ninja-build pkg-config git python3 python3-pip
  nlohmann-json3-dev libcli11-dev libfmt-dev libpcre2-dev libopenblas-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcpp-httplib-dev)

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if ! $PY -c "import tokenizers, numpy, pytest, safetensors, openai, schemathesis, jinja2, requests" >/dev/null 2>&1; then
  echo "install-deps: pip install -r requirements-dev.txt" >&2
  $PY -m pip install -q -r requirements-dev.txt 2>&1 | grep -v "WARNING: Running pip as the 'root'" || true
fi
