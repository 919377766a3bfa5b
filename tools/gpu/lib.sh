# Shared by the device scripts (bench_e2e.sh, hf_oracle.sh): source it, then call qs_gpu_setup.
#   qs_gpu_setup          cd to the repository; sets repo, out ($OUT or ./out, created), build
#                         ($QS_GPU_BUILD or build-gpu, its env.sh sourced) and qs (the binary)
#   qs_make_model NAME    /tmp/qs-NAME unless present: NAME a shape of make_synthetic_model.py
#                         (seeded random bf16 weights drawn on the GPU) or padded-SHAPE (the
#                         bundled model padded by pad_model.py); log in $out/make-NAME.log.
#                         Prints the time taken; returns 1 (after the log's tail) on failure.
#   qs_find_ncu           sets ncu_bin to Nsight Compute's ncu; returns 1 (with a message) if none

qs_gpu_setup() {
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  cd "$repo" || return 1
  out=${OUT:-$repo/out}
  build=${QS_GPU_BUILD:-$repo/build-gpu}
  mkdir -p "$out"
  if [[ -f $build/env.sh ]]; then source "$build/env.sh"; fi
  qs=$build/quantspec
}

qs_find_ncu() {
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  [[ -x $ncu_bin ]] || { echo "ncu not found" >&2; return 1; }
}

qs_make_model() {
  local name=$1 dir=/tmp/qs-$1 t0=$SECONDS
  [[ -f $dir/config.json ]] && return 0  # config.json is written last: the model is complete
  rm -rf "$dir"                          # a partial one from an interrupted run
  if [[ $name == padded-* ]]; then
    python3 tools/pad_model.py --shape "${name#padded-}" --src models/default --out "$dir"
  else
    python3 tools/make_synthetic_model.py --shape "$name" --out "$dir" --torch-device cuda
  fi >"$out/make-$name.log" 2>&1 || {
    echo "cannot make $name:"
    tail -3 "$out/make-$name.log"
    return 1
  }
  echo "made $name in $((SECONDS - t0)) s"
}
