#!/usr/bin/env python3
"""Turn `quantspec bench -o` JSON files into markdown tables and (optionally) PNG plots.

  python3 tools/bench_report.py out/e2e-*.json --markdown report.md --plots docs/img

Per model and context: every mode at its best gamma (highest decode tokens/s, repeats
averaged) with tokens/s, ms/token, speedup vs AR fp16 and vs AR INT8 (when those ran),
acceptance, KV cache and peak device memory; then the gamma sweep of the speculative modes, and
the ms/token projected from each speculative cell's measured phase times for acceptance rates
0.85 / 0.90 / 0.95 (the phases do not depend on acceptance, so random-weight runs give them too),
including the round's host-side sampling and flush time measured in the same run (the AR
baselines' ms/token include their sampling too).
Plots (matplotlib): speedup vs context, acceptance vs gamma, memory vs context, and (with
speculative cells) the speedup projected at acceptance 0.9 vs context.
`--merge NAME` first joins files of one model (e.g. one device call per context) into one report
named NAME.
"""
import argparse
import collections
import json
import os
import statistics
import sys

BASELINES = ("ar-fp16", "ar-int8")
HF_MODE = "hf-transformers"  # bench_mode of tools/hf_decode_bench.py's rows
ALPHAS = (0.85, 0.90, 0.95)


def projected_ms(draft_ms, verify_ms, gamma, alpha, round_ms=0.0):
    """ms/token of rounds of `gamma` draft steps, one verification and `round_ms` of host work
    (sampling, flush) when each draft token is accepted with probability alpha:
    E[tokens per round] = (1 - alpha^(gamma+1)) / (1 - alpha) (the accepted prefix plus the
    target's own token)."""
    tokens = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return (gamma * draft_ms + verify_ms + round_ms) / tokens


def round_overhead_ms(cell):
    """Host-side sampling + flush time per round of a speculative cell (0 when not recorded)."""
    rounds = cell.get("rounds", 0)
    if not rounds:
        return 0.0
    return 1e3 * (cell.get("sample_s", 0.0) + cell.get("flush_s", 0.0)) / rounds


def load(paths):
    reports = []
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        if r.get("command") != "bench" or "runs" not in r:
            sys.exit(f"bench_report: {p} is not a `quantspec bench` JSON file")
        r["_path"] = p
        reports.append(r)
    return reports


def merge(reports, name):
    """One report of every run in `reports` (all of one model: the same config), named `name`."""
    first = reports[0]
    def same_model(a, b):  # the keys both files record agree (older files record fewer)
        a, b = a.get("config") or {}, b.get("config") or {}
        return all(a[k] == b[k] for k in a.keys() & b.keys())

    for r in reports[1:]:
        if not same_model(r, first):
            sys.exit(f"bench_report: --merge: {r['_path']} is another model than {first['_path']}")
    merged = dict(first)
    merged["runs"] = [run for r in reports for run in r["runs"]]
    merged["_path"] = name
    merged["_sources"] = [os.path.basename(r["_path"]) for r in reports]
    for key in ("commit", "date", "generated_tokens"):
        values = sorted({str(r.get(key, "?")) for r in reports})
        merged[key] = values[0] if len(values) == 1 else ", ".join(values)
    return merged


def projectable(key, cell):
    """A speculative cell with both phases measured."""
    return bool(key[2]) and cell.get("draft_ms_per_step", 0) > 0 and \
        cell.get("verify_ms_per_step", 0) > 0


def cell_projected_ms(cell, gamma, alpha):
    """A projectable cell's ms/token at acceptance `alpha` (its host time per round included)."""
    return projected_ms(cell["draft_ms_per_step"], cell["verify_ms_per_step"], gamma, alpha,
                        round_overhead_ms(cell))


def best_projected(cs, alpha):
    """{(mode, context): the lowest ms/token projected at `alpha` over the mode's gammas}."""
    best = {}
    for (mode, ctx, g), c in cs.items():
        if projectable((mode, ctx, g), c):
            ms = cell_projected_ms(c, g, alpha)
            best[(mode, ctx)] = min(ms, best.get((mode, ctx), ms))
    return best


def model_label(r):
    c = r.get("config", {})
    name = os.path.basename(str(r.get("model", "?")).rstrip("/"))
    return (f"{name} ({c.get('layers')} layers, hidden {c.get('hidden')}, heads "
            f"{c.get('heads')}/{c.get('kv_heads')} kv, vocab {c.get('vocab')})")


def cells(report):
    """{(mode, context, gamma): averaged run dict} over repeats."""
    groups = collections.defaultdict(list)
    for run in report["runs"]:
        # Rounds of --gamma auto (adaptive_gamma) are no point of the fixed-gamma sweep: key 0,
        # as a mode's default, so that they are neither projected nor in the acceptance plot.
        gamma = 0 if run.get("adaptive_gamma") else run.get("gamma", 0)
        groups[(run["bench_mode"], run["context"], gamma)].append(run)
    out = {}
    for key, runs in groups.items():
        avg = dict(runs[0])
        for field in ("decode_tok_s", "ms_per_token", "acceptance_rate", "mean_accepted_length",
                      "draft_ms_per_step", "verify_ms_per_step", "prefill_s", "sample_s",
                      "flush_s", "rounds"):
            avg[field] = statistics.fmean(r.get(field, 0.0) for r in runs)
        avg["peak_device_memory_bytes"] = max(r.get("peak_device_memory_bytes", -1) for r in runs)
        avg["repeats"] = len(runs)
        out[key] = avg
    return out


def best_per_mode(cs):
    """{(mode, context): the cell with the highest tokens/s over gamma}."""
    best = {}
    for (mode, ctx, _), cell in cs.items():
        key = (mode, ctx)
        if key not in best or cell["decode_tok_s"] > best[key]["decode_tok_s"]:
            best[key] = cell
    return best


def gib(b):
    return "-" if b is None or b < 0 else f"{b / 2**30:.2f}"


def markdown(reports):
    lines = []
    for r in reports:
        cs = cells(r)
        best = best_per_mode(cs)
        modes = sorted({m for m, _ in best}, key=lambda m: (m not in BASELINES, m))
        contexts = sorted({c for _, c in best})
        lines += [f"### {model_label(r)}", "",
                  f"Device: {r.get('device', '?')}; commit {r.get('commit', '?')}, {r.get('date', '?')}; "
                  f"{r.get('generated_tokens')} generated tokens per run, temperature "
                  f"{r.get('temperature', 0)}; source "
                  f"{', '.join(f'`{x}`' for x in r.get('_sources', [os.path.basename(r['_path'])]))}.",
                  "",
                  "| context | mode | best γ | tok/s | ms/token | vs AR fp16 | vs AR INT8 | acceptance | "
                  "KV GiB | peak GiB |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for ctx in contexts:
            for mode in modes:
                cell = best.get((mode, ctx))
                if not cell:
                    continue
                speed = []
                for base in BASELINES:
                    b = best.get((base, ctx))
                    speed.append(f"{cell['decode_tok_s'] / b['decode_tok_s']:.2f}x" if b else "-")
                spec = cell.get("drafted", 0) > 0  # a speculative mode (not AR, not HF)
                gamma = ("auto" if cell.get("adaptive_gamma") else cell.get("gamma", "-")) \
                    if spec else "-"
                accept = f"{cell['acceptance_rate']:.3f}" if spec else "-"
                lines.append(
                    f"| {ctx} | {mode} | {gamma} | {cell['decode_tok_s']:.1f} | "
                    f"{cell['ms_per_token']:.2f} | {speed[0]} | {speed[1]} | {accept} | "
                    f"{gib(cell.get('kv_cache_bytes'))} | "
                    f"{gib(cell.get('peak_device_memory_bytes'))} |")
        sweep = sorted(k for k in cs if k[2])
        if sweep:
            lines += ["", "γ sweep (speculative modes):", "",
                      "| context | mode | γ | acceptance | mean accepted length | tok/s | draft ms/step | "
                      "verify ms/round |",
                      "|---:|---|---:|---:|---:|---:|---:|---:|"]
            for mode, ctx, g in sorted(sweep, key=lambda k: (k[1], k[0], k[2])):
                c = cs[(mode, ctx, g)]
                lines.append(f"| {ctx} | {mode} | {g} | {c['acceptance_rate']:.3f} | "
                             f"{c['mean_accepted_length']:.2f} | {c['decode_tok_s']:.1f} | "
                             f"{c['draft_ms_per_step']:.3f} | {c['verify_ms_per_step']:.3f} |")
        lines += projection_lines(cs, best)
        lines.append("")
    return "\n".join(lines)


def projection_lines(cs, best):
    """The projected table (mode first in each row, so rows never start with a context)."""
    spec = sorted((k for k, c in cs.items() if projectable(k, c)),
                  key=lambda k: (k[1], k[0], k[2]))
    if not spec:
        return []
    # HF transformers' decode (tools/hf_decode_bench.py) is a third reference where it ran.
    refs = BASELINES + ((HF_MODE,) if any(m == HF_MODE for m, _ in best) else ())
    names = "vs AR fp16, vs AR INT8" + (", vs HF" if len(refs) > 2 else "")
    head = " | ".join(f"α={a:.2f}: ms/token ({names})" for a in ALPHAS)
    lines = ["", "Projected from the measured phases (ms/token = (γ·draft + verify + host) / "
             "E[tokens per round]; host = sampling + flush per round):", "",
             f"| mode | context | γ | draft ms/step | verify ms/round | host ms/round | {head} |",
             "|---|---:|---:|---:|---:|---:|" + "---:|" * len(ALPHAS)]
    for mode, ctx, g in spec:
        c = cs[(mode, ctx, g)]
        host = round_overhead_ms(c)
        parts = []
        for a in ALPHAS:
            ms = cell_projected_ms(c, g, a)
            vs = [f"{best[(b, ctx)]['ms_per_token'] / ms:.2f}x" if (b, ctx) in best else "-"
                  for b in refs]
            parts.append(f"{ms:.2f} ({', '.join(vs)})")
        lines.append(f"| {mode} | {ctx} | {g} | {c['draft_ms_per_step']:.3f} | "
                     f"{c['verify_ms_per_step']:.3f} | {host:.3f} | " + " | ".join(parts) + " |")
    return lines


def plots(reports, folder):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(folder, exist_ok=True)
    written = []

    def figure(report, tag, name, series, xlabel, ylabel, log_x):
        """One PNG: series = [(label, xs, ys)] (empty ones skipped)."""
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, xs, ys in series:
            if xs:
                ax.plot(xs, ys, marker="o", label=label)
        if log_x:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(model_label(report), fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        path = os.path.join(folder, f"{tag}-{name}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    for r in reports:
        cs = cells(r)
        best = best_per_mode(cs)
        tag = r["_path"] if "_sources" in r else os.path.splitext(os.path.basename(r["_path"]))[0]
        contexts = sorted({c for _, c in best})
        modes = sorted({m for m, _ in best})
        # Speedup vs context over AR fp16.
        speedup = []
        for mode in modes:
            pts = [(c, best[(mode, c)]["decode_tok_s"] / best[("ar-fp16", c)]["decode_tok_s"])
                   for c in contexts if (mode, c) in best and ("ar-fp16", c) in best]
            speedup.append((mode, [x for x, _ in pts], [y for _, y in pts]))
        figure(r, tag, "speedup", speedup, "context (tokens)", "decode speedup vs AR fp16", True)
        # Acceptance vs gamma.
        sweep = sorted(k for k in cs if k[2])
        if sweep:
            acceptance = []
            for mode, ctx in sorted({(m, c) for m, c, _ in sweep}):
                gs = sorted(g for m, c, g in sweep if m == mode and c == ctx)
                acceptance.append((f"{mode} @ {ctx}", gs,
                                   [cs[(mode, ctx, g)]["acceptance_rate"] for g in gs]))
            figure(r, tag, "acceptance", acceptance, "γ (draft tokens per round)",
                   "acceptance rate", False)
        # KV memory vs context.
        memory = []
        for mode in modes:
            xs = [c for c in contexts if (mode, c) in best]
            memory.append((mode, xs, [best[(mode, c)].get("kv_cache_bytes", 0) / 2**30
                                      for c in xs]))
        figure(r, tag, "memory", memory, "context (tokens)", "KV cache (GiB)", True)
        # Speedup over AR fp16 projected at acceptance 0.9 (each mode's best γ), with AR INT8's
        # measured one: what the phases give where the run's own acceptance means nothing.
        proj = best_projected(cs, 0.9)
        if proj:
            series = []
            for mode in sorted({m for m, _ in proj}):
                xs = [c for c in contexts if (mode, c) in proj and ("ar-fp16", c) in best]
                series.append((f"{mode} (α = 0.9)", xs,
                               [best[("ar-fp16", c)]["ms_per_token"] / proj[(mode, c)] for c in xs]))
            xs = [c for c in contexts if ("ar-int8", c) in best and ("ar-fp16", c) in best]
            series.append(("ar-int8 (measured)", xs,
                           [best[("ar-fp16", c)]["ms_per_token"] / best[("ar-int8", c)]["ms_per_token"]
                            for c in xs]))
            figure(r, tag, "projected-speedup", series, "context (tokens)",
                   "speedup vs AR fp16", True)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", help="quantspec bench -o files")
    ap.add_argument("--markdown", help="write the tables here (default: stdout)")
    ap.add_argument("--plots", help="write PNG plots into this folder")
    ap.add_argument("--merge", metavar="NAME",
                    help="join the files (one model) into one report named NAME first")
    args = ap.parse_args()
    reports = load(args.json)
    if args.merge:
        reports = [merge(reports, args.merge)]
    text = markdown(reports)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    if args.plots:
        for p in plots(reports, args.plots):
            print(f"wrote {p}", file=sys.stderr)


if __name__ == "__main__":
    main()
