#!/usr/bin/env bash
# The main job: install, build, and generate text with the bundled default model.
# Extra arguments go to `quantspec generate` (default: a short prompt).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
if [ $# -eq 0 ]; then
  set -- -p "The quick brown fox" -n 64
fi
exec build/quantspec generate "$@"
