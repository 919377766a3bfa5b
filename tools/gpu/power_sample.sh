#!/usr/bin/env bash
# A command's board power and SM clock (runs ON the GPU machine): nvidia-smi samples every 100 ms
# while COMMAND runs, into $OUT/power-LABEL.csv, then the median / 90th percentile of the samples
# taken while the GPU was busy (power above 200 W). `read` as the command: tools/gpu/read_power.cu,
# reads only, for reference.
#
#   OUT=/tmp/logs bash tools/gpu/power_sample.sh read read
#   OUT=/tmp/logs bash tools/gpu/power_sample.sh qs-7b-128k build-gpu/quantspec bench ...
set -uo pipefail
label=${1:?usage: power_sample.sh LABEL COMMAND...}
shift
out=${OUT:-out}
mkdir -p "$out"
if [[ $1 == read ]]; then
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  "$nvcc" -O3 -arch=sm_90 -o /tmp/read_power "$(dirname "$0")/read_power.cu" || exit 1
  set -- /tmp/read_power 5000
fi
csv=$out/power-$label.csv
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw --format=csv,noheader -lms 100 >"$csv" &
smi=$!
"$@"
rc=$?
kill "$smi"
python3 - "$csv" "$label" <<'PY'
import statistics, sys
rows = [l.split(',') for l in open(sys.argv[1]) if l.count(',') >= 3]
busy = [(float(r[1].split()[0]), float(r[3].split()[0])) for r in rows if float(r[3].split()[0]) > 200]
if not busy:
    sys.exit(f"{sys.argv[2]}: no busy samples")
clock = sorted(c for c, _ in busy); power = sorted(p for _, p in busy)
q = lambda v, f: v[min(len(v) - 1, int(f * len(v)))]
print(f"{sys.argv[2]}: {len(busy)} busy samples; SM clock median {statistics.median(clock):.0f} MHz "
      f"(10th pct {q(clock, 0.1):.0f}); power median {statistics.median(power):.0f} W (90th pct {q(power, 0.9):.0f})")
PY
exit $rc
