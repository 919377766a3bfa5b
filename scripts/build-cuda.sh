#!/usr/bin/env bash
# Compile the CUDA backend, its conformance tests and the quantspec CLI with --device cuda (sm_90a unless CMAKE_CUDA_ARCHITECTURES says otherwise)
# into build-cuda/.
# Needs nvcc, not a GPU: CI runs this to keep the CUDA code compiling; the GPU machine runs the
# results through tools/gpu/check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DQS_CUDA=ON "$@" >/dev/null
fi
targets=(qs_backend_cuda quantspec)
grep -q '^test_cuda:' <(cmake --build "$BUILD_DIR" --target help 2>/dev/null | sed 's/^\.\.\. //; s/: .*/:/') \
  && targets+=(test_cuda)
cmake --build "$BUILD_DIR" -j"$(nproc)" --target "${targets[@]}"
