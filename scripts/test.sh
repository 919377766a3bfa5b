#!/usr/bin/env bash
# Install, build, and run every CPU test (C++ GoogleTest suites and the CLI/server end-to-end
# tests) via ctest. Where nvcc is installed, the CUDA backend and its tests are compiled too
# (build-cuda/; they run on the GPU machine: tools/gpu/check.sh). QS_SKIP_CUDA=1 skips that.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
if command -v nvcc >/dev/null && [ "${QS_SKIP_CUDA:-0}" != 1 ]; then
  echo "test.sh: compiling the CUDA backend (scripts/build-cuda.sh)" >&2
  scripts/build-cuda.sh >/dev/null
fi
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -L cpu -j"$(nproc)" "$@"
