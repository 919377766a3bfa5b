#!/usr/bin/env python3
"""Prefill time of a conversation's next turn with and without the server's prompt cache.

Starts `quantspec serve` (--port 0, the given mode and --prompt-cache on|off), posts the first N
held-out tokens (greedy, --new tokens), the same prompt again, the first N - Q tokens and Q others
(another question on the same document), then the first N + M tokens (a prompt that extends the
first; after the question the cache shares N - Q tokens with it), and prints each response's
prompt tokens, kept prompt tokens (usage.prompt_tokens_details.cached_tokens) and prefill seconds
(quantspec.prefill_s).

    python3 tools/prompt_cache_bench.py build/quantspec quantspec on [--first 4000] [--more 300]
        [--question 100] [--new 64] [--model DIR] [--device cuda]
"""
import argparse
import json
import re
import subprocess
import urllib.request

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("mode", choices=["ar", "quantspec"])
    ap.add_argument("cache", choices=["on", "off"])
    ap.add_argument("--first", type=int, default=4000)
    ap.add_argument("--more", type=int, default=300)
    ap.add_argument("--question", type=int, default=100)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--tokens", default="models/default/heldout.u16")
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--model", help="model directory (default: the binary's default model)")
    ap.add_argument("--device", help="cpu or cuda (default: the binary's default)")
    a = ap.parse_args()

    ids = np.fromfile(a.tokens, dtype=np.uint16)[: a.first + a.more + a.question]
    ids = ids.astype(int).tolist()
    question = ids[: a.first - a.question] + ids[a.first + a.more:]
    cmd = [a.binary, "serve", "--port", "0", "--ctx", str(a.ctx), "--mode", a.mode,
           "--prompt-cache", a.cache]
    cmd += ["-m", a.model] if a.model else []
    cmd += ["--device", a.device] if a.device else []
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    port = None
    startup = []
    for line in proc.stderr:
        startup.append(line)
        m = re.search(r"listening on http://[^ ]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        raise SystemExit("the server did not start:\n" + "".join(startup[-10:]))

    def post(prompt):
        body = {"prompt": prompt, "max_tokens": a.new, "temperature": 0, "ignore_eos": True}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.load(r)

    try:
        for what, prompt in (("first", ids[: a.first]), ("again", ids[: a.first]),
                             ("question", question), ("next turn", ids[: a.first + a.more])):
            r = post(prompt)
            print(f"{a.mode} cache {a.cache} {what}: prompt {r['usage']['prompt_tokens']}, kept "
                  f"{r['usage']['prompt_tokens_details']['cached_tokens']}, prefill "
                  f"{r['quantspec']['prefill_s']:.3f} s")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
