#!/usr/bin/env bash
# An end-to-end A/B of one QS_* switch on the GPU machine (after tools/gpu/check.sh's build
# stage): the arms alternate (A B A B ...: the pool's machines drift with the 700 W cap, so both
# arms see the same drift), one `quantspec bench` process per arm, repeat and mode
# (tools/gpu/bench_matrix.sh) at one context, then one line per run and the arms' medians
# (tools/gpu/ab_summary.py).
#
#   QS_AB_SWITCH=QS_DECODE_TC_T bash tools/gpu/ab_switch.sh llama2-7b
#   QS_AB_SWITCH=QS_DEFER_NORM QS_AB_MODES=quantspec,ar-fp16,ar-int8 \
#     QS_AB_REPEATS=1 bash tools/gpu/ab_switch.sh llama3.1-8b
#
# Environment: QS_AB_SWITCH (the variable, required), QS_AB_VALUES (its values, default 1,0),
# QS_AB_REPEATS (rounds of all arms, default 2), QS_AB_MODES (default quantspec), QS_AB_CONTEXT
# (default 131072), QS_AB_TOKENS (default 256), QS_AB_DEADLINE (seconds: no new run starts
# after it), OUT. Runs go to OUT/ab-<value>-<repeat>/; the summary to OUT/ab-summary.txt.
set -uo pipefail

shape=${1:?usage: QS_AB_SWITCH=NAME ab_switch.sh SHAPE}
switch=${QS_AB_SWITCH:?QS_AB_SWITCH (the switch to compare) is required}
[[ $switch =~ ^QS_[A-Z0-9_]+$ ]] || { echo "ab_switch: $switch is not a QS_* name" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/../../out}
mkdir -p "$out"
values=${QS_AB_VALUES:-1,0}
repeats=${QS_AB_REPEATS:-2}
deadline=${QS_AB_DEADLINE:-}
echo "ab_switch: $shape, $switch in {$values} x $repeats, modes ${QS_AB_MODES:-quantspec}," \
  "context ${QS_AB_CONTEXT:-131072}, ${QS_AB_TOKENS:-256} tokens, out $out"
for ((rep = 1; rep <= repeats; ++rep)); do
  for value in ${values//,/ }; do
    if [[ -n $deadline ]] && ((SECONDS > deadline)); then
      echo "ab_switch: skipped $switch=$value round $rep (deadline: $SECONDS s > $deadline s)"
      continue
    fi
    env "$switch=$value" OUT="$out/ab-$value-$rep" QS_MATRIX_TOKENS="${QS_AB_TOKENS:-256}" \
      QS_MATRIX_CONTEXTS="${QS_AB_CONTEXT:-131072}" QS_MATRIX_MODES="${QS_AB_MODES:-quantspec}" \
      bash "$here/bench_matrix.sh" "$shape" >"$out/ab-$value-$rep.log" 2>&1
    echo "ab_switch: $switch=$value round $rep: rc $? at $SECONDS s"
  done
done
shopt -s nullglob
files=("$out"/ab-*/n*/*/e2e-*.json)
((${#files[@]})) || { echo "ab_switch: no results" >&2; exit 1; }
python3 "$here/ab_summary.py" --switch "$switch" "${files[@]}" | tee "$out/ab-summary.txt"
