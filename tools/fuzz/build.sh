#!/bin/sh
# Builds the libFuzzer targets with clang (ASan + UBSan) into build-fuzz/ and, with `run`,
# fuzzes each for FUZZ_SECONDS (default 60) from a seed corpus written by this script.
#   tools/fuzz/build.sh [run]
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT="$ROOT/build-fuzz"
CXX=${CXX:-clang++-14}
FLAGS="-std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I$ROOT/src"
mkdir -p "$OUT"
$CXX $FLAGS -o "$OUT/safetensors_fuzz" "$ROOT/tools/fuzz/safetensors_fuzz.cpp" \
  "$ROOT/src/model/safetensors.cpp" "$ROOT/src/core/mmap_file.cpp" -lfmt
$CXX $FLAGS -o "$OUT/config_fuzz" "$ROOT/tools/fuzz/config_fuzz.cpp" \
  "$ROOT/src/model/config.cpp" -lfmt
[ "${1:-}" = run ] || exit 0

mkdir -p "$OUT/corpus_st" "$OUT/corpus_cfg"
python3 - "$OUT" <<'PY'
import json, struct, sys
out = sys.argv[1]
def st(header, data):
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data
open(f"{out}/corpus_st/a", "wb").write(st({"__metadata__": {"format": "pt"},
    "w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
    "b": {"dtype": "F32", "shape": [3], "data_offsets": [12, 24]},
    "q": {"dtype": "I8", "shape": [], "data_offsets": [24, 25]}}, bytes(range(25))))
open(f"{out}/corpus_cfg/a", "w").write(json.dumps({"architectures": ["LlamaForCausalLM"],
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 100,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "eos_token_id": [1, 2]}))
PY
"$OUT/safetensors_fuzz" -max_total_time="${FUZZ_SECONDS:-60}" -max_len=4096 "$OUT/corpus_st"
"$OUT/config_fuzz" -max_total_time="${FUZZ_SECONDS:-60}" -max_len=4096 "$OUT/corpus_cfg"
