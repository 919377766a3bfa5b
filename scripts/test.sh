#!/usr/bin/env bash
# Install, build, and run every CPU test (C++ GoogleTest suites and CLI end-to-end tests) via ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -L cpu -j"$(nproc)" "$@"
