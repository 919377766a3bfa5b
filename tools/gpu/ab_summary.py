#!/usr/bin/env python3
"""One line per run of `quantspec bench -o` JSON files, grouped by the value of one QS_* switch
(the file's kernel_switches; "unset" where the run did not set it), then each arm's medians and
its change against the first arm (tools/gpu/ab_switch.sh).

  python3 tools/gpu/ab_summary.py --switch QS_DECODE_TC_T out/ab-*/n*/*/e2e-*.json

Per run: mode, context, gamma and, for a speculative run, the draft step and verification ms
and the ms/token projected at acceptance 0.9 ((gamma draft + verify) / E[tokens per round],
tools/bench_report.py), for an AR run its ms/token.
"""
import argparse
import collections
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_report import projected_ms  # noqa: E402

ALPHA = 0.9


def rows_of(path, switch):
    with open(path) as f:
        report = json.load(f)
    arm = dict(report.get("kernel_switches") or {}).get(switch, "unset")
    for run in report.get("runs", []):
        if "error" in run:
            continue
        row = {"arm": arm, "file": path, "mode": run.get("bench_mode", run.get("mode", "?")),
               "context": run.get("context", 0), "gamma": run.get("gamma", 0)}
        if run.get("draft_ms_per_step") and run.get("verify_ms_per_step"):
            row["draft"] = run["draft_ms_per_step"]
            row["verify"] = run["verify_ms_per_step"]
            row["ms"] = projected_ms(row["draft"], row["verify"], row["gamma"], ALPHA)
        elif run.get("ms_per_token"):
            row["ms"] = run["ms_per_token"]
        else:
            continue
        yield row


def fmt(v):
    return "-" if v is None else f"{v:.3f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--switch", required=True, help="the QS_* variable the arms differ in")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    rows = [r for p in args.files for r in rows_of(p, args.switch)]
    if not rows:
        print("ab_summary: no runs with phase times or ms/token", file=sys.stderr)
        return 1
    print(f"{'arm':>8} {'mode':>14} {'context':>8} {'gamma':>5} {'draft ms':>9} "
          f"{'verify ms':>9} {'ms/token':>9}  (speculative: projected at acceptance {ALPHA})")
    for r in rows:
        print(f"{r['arm']:>8} {r['mode']:>14} {r['context']:>8} {r['gamma']:>5} "
              f"{fmt(r.get('draft')):>9} {fmt(r.get('verify')):>9} {fmt(r['ms']):>9}")
    groups = collections.OrderedDict()
    for r in rows:
        groups.setdefault((r["mode"], r["context"], r["gamma"]), collections.OrderedDict()) \
            .setdefault(r["arm"], []).append(r)
    print(f"\nmedians per arm ({args.switch}); change of ms/token against the first arm")
    for (mode, context, gamma), arms in groups.items():
        first = None
        for arm, rs in arms.items():
            med = {k: statistics.median(r[k] for r in rs) if all(k in r for r in rs) else None
                   for k in ("draft", "verify", "ms")}
            first = med["ms"] if first is None else first
            change = 100.0 * (med["ms"] / first - 1.0)
            print(f"{mode:>14} {context:>8} g{gamma} {args.switch}={arm:<6} n={len(rs)} draft "
                  f"{fmt(med['draft'])} verify {fmt(med['verify'])} ms/token {fmt(med['ms'])} "
                  f"({change:+.2f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
