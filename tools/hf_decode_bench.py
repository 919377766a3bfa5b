#!/usr/bin/env python3
"""Decode speed of HF transformers on a model directory: "what people use today", the reference
row of docs/RESULTS.md. Writes the same JSON as `quantspec bench -o` (bench_mode
"hf-transformers"), so tools/bench_report.py reads it.

  python3 tools/hf_decode_bench.py --model /tmp/qs-llama2-7b --contexts 4096,32768 \
      --tokens 128 --device cuda --dtype bfloat16 --static -o hf-llama2-7b.json

Per context: a seeded random prompt (or the start of --prompt-tokens), greedy generation of
--tokens new tokens (EOS ignored). Decode time = time(generate N+1 tokens) - time(generate 1
token) (the latter is the prefill plus one step), divided by N; each the median of --repeats
runs (default 3) after a warm-up run.
--static: transformers' documented static-cache recipe instead of generate() (the issue's
"compiled HF" peer): a StaticCache sized for the prompt and the new tokens, the prompt run
eagerly in chunks of --prefill-chunk tokens (one 128K chunk would materialise a 32 GiB mask /
score matrix in SDPA), then greedy decoding steps compiled with torch.compile(mode=
"reduce-overhead", fullgraph=True) (CUDA graphs). Decode time = the wall time of --tokens steps
after --warmup compiled steps; prefill_s is the chunked eager prefill (not the figure to compare
prefill speed with).
"""
import argparse
import json
import os
import sys
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--contexts", required=True, help="comma-separated prompt lengths")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--static", action="store_true", help="static KV cache (+ compiled decode)")
    ap.add_argument("--prompt-tokens", help="raw little-endian u16 token file for the prompts")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa, eager, ...)")
    ap.add_argument("--prefill-chunk", type=int, default=8192,
                    help="--static: prompt tokens per eager prefill step")
    ap.add_argument("--warmup", type=int, default=4,
                    help="--static: compiled decoding steps before the timed ones")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed runs per length (median); 1 for large models at long context")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    contexts = [int(c) for c in args.contexts.split(",")]
    if min(contexts) < 1 or args.tokens < 1 or args.repeats < 1:
        sys.exit("hf_decode_bench: contexts, --tokens and --repeats must be >= 1")
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype,
                                                 attn_implementation=args.attn)
    model = model.to(args.device).eval()
    vocab = model.config.vocab_size
    if args.prompt_tokens:
        pool = np.fromfile(args.prompt_tokens, dtype="<u2").astype(np.int64)
        if len(pool) < max(contexts):
            sys.exit(f"hf_decode_bench: {args.prompt_tokens} has {len(pool)} tokens, fewer than "
                     f"{max(contexts)}")
    else:
        pool = np.random.default_rng(1).integers(0, min(vocab, 32000), max(contexts))
    cuda = args.device.startswith("cuda")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def generate(ids, n):
        kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                  pad_token_id=0)
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, **kw)
        sync()
        assert out.shape[1] == ids.shape[1] + n, "generation stopped early"
        return time.perf_counter() - t0

    def decode_one(tok, pos, cache):
        logits = model(tok, position_ids=pos.unsqueeze(0), cache_position=pos,
                       past_key_values=cache, return_dict=False, use_cache=True)[0]
        return torch.argmax(logits[:, -1], dim=-1)[:, None]

    compiled_decode = torch.compile(decode_one, mode="reduce-overhead", fullgraph=True)

    def static_run(ids, n):
        """(prefill seconds, decode seconds of n steps) with the static-cache recipe."""
        from transformers import StaticCache
        ctx = ids.shape[1]
        cache = StaticCache(config=model.config, max_cache_len=ctx + args.warmup + n + 1)
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            for s in range(0, ctx, args.prefill_chunk):
                e = min(ctx, s + args.prefill_chunk)
                pos = torch.arange(s, e, device=args.device)
                logits = model(ids[:, s:e], position_ids=pos.unsqueeze(0), cache_position=pos,
                               past_key_values=cache, return_dict=False, use_cache=True,
                               logits_to_keep=1)[0]
            tok = torch.argmax(logits[:, -1], dim=-1)[:, None]
            sync()
            prefill_s = time.perf_counter() - t0
            pos = ctx
            for _ in range(args.warmup):
                tok = compiled_decode(tok, torch.tensor([pos], device=args.device), cache).clone()
                pos += 1
            sync()
            t1 = time.perf_counter()
            for _ in range(n):
                tok = compiled_decode(tok, torch.tensor([pos], device=args.device), cache).clone()
                pos += 1
            sync()
        return prefill_s, time.perf_counter() - t1

    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    report = {"command": "bench", "tool": "hf_decode_bench", "model": args.model,
              "device": device_name, "backend": args.device,
              "commit": os.environ.get("QS_COMMIT", "unknown"),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "transformers": transformers.__version__, "torch": torch.__version__,
              "dtype": args.dtype, "static_cache": args.static, "repeats": args.repeats,
              "prefill_chunk": args.prefill_chunk if args.static else None,
              "generated_tokens": args.tokens, "temperature": 0.0,
              "config": {"layers": model.config.num_hidden_layers,
                         "head_dim": getattr(model.config, "head_dim", None) or
                         model.config.hidden_size // model.config.num_attention_heads,
                         "hidden": model.config.hidden_size,
                         "heads": model.config.num_attention_heads,
                         "kv_heads": model.config.num_key_value_heads,
                         "vocab": vocab,
                         "intermediate": model.config.intermediate_size},
              "runs": []}
    print(f"device: {device_name}; transformers {transformers.__version__}, torch "
          f"{torch.__version__}, {args.dtype}, {'static cache' if args.static else 'dynamic cache'}")
    print(f"{'mode':<16} {'context':>7} {'prefill_s':>9} {'tok/s':>9} {'ms/tok':>8} {'peak_GiB':>8}")
    for ctx in contexts:
        ids = torch.tensor(pool[:ctx][None, :], dtype=torch.long, device=args.device)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        if args.static:
            runs = [static_run(ids, args.tokens) for _ in range(args.repeats)]
            t_one = float(np.median([r[0] for r in runs]))
            decode_s = float(np.median([r[1] for r in runs]))
        else:
            generate(ids, 2)  # warm-up
            # Medians: the difference of two timings is noisy for small models.
            t_one = float(np.median([generate(ids, 1) for _ in range(args.repeats)]))
            t_all = float(np.median([generate(ids, args.tokens + 1) for _ in range(args.repeats)]))
            decode_s = max(t_all - t_one, 1e-9)
        peak = torch.cuda.max_memory_allocated() if cuda else -1
        row = {"bench_mode": "hf-transformers", "mode": "hf", "context": ctx, "repeat": 0,
               "prompt_tokens": ctx, "generated_tokens": args.tokens, "prefill_s": t_one,
               "decode_s": decode_s, "decode_tok_s": args.tokens / decode_s,
               "ms_per_token": 1e3 * decode_s / args.tokens, "acceptance_rate": 0.0,
               "mean_accepted_length": 0.0, "draft_ms_per_step": 0.0,
               "verify_ms_per_step": 1e3 * decode_s / args.tokens,
               "peak_device_memory_bytes": peak, "kv_cache_bytes": -1}
        report["runs"].append(row)
        print(f"{'hf-transformers':<16} {ctx:>7} {t_one:>9.3f} {row['decode_tok_s']:>9.2f} "
              f"{row['ms_per_token']:>8.3f} {peak / 2**30 if peak >= 0 else -1:>8.2f}", flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
