#!/usr/bin/env bash
# Build with AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/) and run every CPU test
# under them: the C++ suites, the CLI's and the server's end-to-end tests (the binary they start
# is the sanitized one). Any sanitizer report fails its test (UBSan halts on the first error).
# Not part of CI (the sanitized build and run take ~20 minutes on 2 cores); run it after changes
# to memory handling, the tokenizer, the server or the cache.
#
#   scripts/sanitize.sh [ctest arguments...]
#
# Left out, and why:
# - KvCacheF16.AllocationFailureNamesTheRealSize asks for 2^48 bytes to see the error message;
#   ASan aborts any allocation above its 1 TiB limit before the allocator can fail.
# - The server's timing and memory tests (a queue's order and 429s under a burst, a queued
#   request cancelled within 130 s of a 4000-token one, RSS growth over 300 requests): ASan runs
#   the server several times slower (more so beside the CLI tests) and holds freed memory in its
#   quarantine, so they measure the sanitizer. Alone, the cancellation test passes under it.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-asan}
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQS_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build "$build" -j"$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export PYTEST_ADDOPTS="-k 'not test_queue_full_gets_429 and not test_fifo_order and not test_load \
  and not test_queued_request_cancelled_when_client_disconnects'"
cd "$build"
ctest --output-on-failure -L cpu -j"$(nproc)" -E '^KvCacheF16\.AllocationFailureNamesTheRealSize$' "$@"
