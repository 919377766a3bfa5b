#!/usr/bin/env bash
# The CLI's long-context paths on the GPU machine (after check.sh's build stage): `generate`
# without --ctx on a TOKENS-token prompt (the context grows to fit it), then `chat` over the same
# text as a document with three questions (the first turn prefills it, the next ones only their
# own tokens, through the engine's prompt cache), then, where the build has the server, `serve`
# under tools/prompt_cache_bench.py (the document, the same prompt again, another question, a
# next turn; 256 new tokens each: the prompt cache's prefill times), in AR fp16 and in
# QuantSpec. The model is the bundled one padded to SHAPE (tools/pad_model.py: its own function
# and acceptance on real text at the shape's memory traffic); the text is the start of its
# held-out tokens.
#
#   bash tools/gpu/cli_long_context.sh llama3.1-8b 12000
#
# Writes OUT/cli-<run>.txt (each run's stderr, stdout in OUT/cli-<run>.out) and prints one line
# per run that starts with "cli: ". QS_CLI_MODEL (a model directory instead of the padded one) and
# QS_CLI_DEVICE (default cuda) let it run anywhere, e.g. on the CPU with the bundled model;
# QS_CLI_PARTS (default "generate chat serve") picks the parts that run; QS_CLI_FORMAT=json runs
# generate and chat in JSON mode (--format json).
set -uo pipefail
shape=${1:?usage: cli_long_context.sh SHAPE TOKENS}
tokens=${2:?usage: cli_long_context.sh SHAPE TOKENS}
source "$(dirname "$0")/lib.sh"
qs_gpu_setup || exit 1
model=${QS_CLI_MODEL:-/tmp/qs-padded-$shape}
[[ -n ${QS_CLI_MODEL:-} ]] || qs_make_model "padded-$shape" || exit 1
doc=$out/document.txt
python3 -c '
import json, sys
import numpy as np
ids = np.fromfile("models/default/heldout.u16", dtype=np.uint16)[: int(sys.argv[1])]
print(json.dumps({"ids": ids.tolist()}))' "$tokens" |
  "$qs" detokenize --skip-special -m models/default |
  python3 -c 'import json, sys; sys.stdout.write(json.loads(sys.stdin.read())["text"])' >"$doc" ||
  exit 1

status=0
parts=" ${QS_CLI_PARTS:-generate chat serve} "
# run NAME ARGS...: one quantspec run on the GPU, its stdin from $input.
run() {
  local name=$1
  shift
  "$qs" "$@" --device "${QS_CLI_DEVICE:-cuda}" -m "$model" <"$input" >"$out/cli-$name.out" 2>"$out/cli-$name.txt"
  local rc=$?
  ((rc != 0)) && status=1
  echo "cli: $name rc $rc: $(grep -E 'context [0-9]+ tokens' "$out/cli-$name.txt" |
    grep -oE 'context [0-9]+ tokens' | head -1)"
  grep -E '^\[|context grown|error' "$out/cli-$name.txt" | sed 's/^/cli:   /'
}
input=/dev/null
[[ $parts == *" generate "* ]] && for mode in ar quantspec; do
  run "generate-$mode" generate -f "$doc" -n 128 --mode "$mode" --format "${QS_CLI_FORMAT:-text}"
done
input=$out/questions.txt
printf '%s\n' "What is this text about?" "Who speaks in it?" "Say it in one sentence." >"$input"
[[ $parts == *" chat "* ]] && for mode in ar quantspec; do
  run "chat-$mode" chat -f "$doc" -n 64 --mode "$mode" --format "${QS_CLI_FORMAT:-text}"
done
[[ $parts == *" serve "* ]] || exit $status
# The device build has no server unless built with QS_GPU_SERVER=ON (build_on_device.sh).
if grep -q '^QS_SERVER:BOOL=OFF' "$(dirname "$qs")/CMakeCache.txt" 2>/dev/null; then
  echo "cli: serve: skipped (this build has no server)"
  exit $status
fi
for mode in ar quantspec; do
  python3 tools/prompt_cache_bench.py "$qs" "$mode" on --model "$model" \
    --device "${QS_CLI_DEVICE:-cuda}" --first $((tokens - 400)) --more 300 --question 100 \
    --new 256 --ctx $((tokens + 512)) >"$out/cli-serve-$mode.txt" 2>&1 || status=1
  sed "s/^/cli: serve-$mode: /" "$out/cli-serve-$mode.txt"
done
exit $status
