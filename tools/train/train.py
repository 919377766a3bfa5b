#!/usr/bin/env python3
"""Trains the bundled Llama-architecture model and exports it in Hugging Face format.

Step 3 of the pipeline (see tools/train/README.md); meant for one GPU (bf16 autocast, SDPA flash
attention, fused AdamW), also runs on the CPU with a tiny configuration for tests.

  train.py --data .train/gpu --export-dir /tmp/export --out-tar $OUT/qs-tiny-16k.tar \\
           --time-budget-s 420

Training: random windows of seq_len + 1 tokens from the train stream (documents as
<|begin_of_text|> ... <|end_of_text|>, concatenated). A fraction --doc-start-frac of the windows
is moved back to the start of the document it falls in, so the model often sees a document begin
at position 0 as it will at inference. The learning rate warms up linearly for --warmup-steps and
then follows a cosine from --lr to --lr * --min-lr-ratio over the run's progress, where progress
is max(step / max_steps, training time / time budget): the schedule ends when either runs out,
so a run cut by --time-budget-s still anneals fully. Seeded (torch, numpy, window sampling);
with a time budget the step count depends on the machine's speed.

Held-out perplexity: the held-out stream is cut into consecutive windows: window k feeds tokens
[k*T, k*T + T) and scores the predictions of tokens [k*T + 1, k*T + T + 1) (T = seq_len; the last
window is shorter). Every token but the first is scored exactly once, with the context of its
window only. ppl = exp(total NLL / scored tokens). The reported figure is computed after export,
from the saved bf16 weights reloaded with transformers' LlamaForCausalLM, in float32 (the
engine's reference); per-window NLL sums go into metrics.json so a subset can be compared.

Export (into --export-dir, then one tar split into <= 15 MB parts when --out-tar is given):
config.json, model*.safetensors (bf16, shards <= 15 MB), tokenizer.json, tokenizer_config.json,
generation_config.json, metrics.json, heldout.u16 (the held-out token stream, raw uint16 LE,
for the engine's perplexity check) and README.md (the model card, from the metrics).
"""
import argparse
import datetime
import hashlib
import json
import lzma
import math
import os
import platform
import shutil
import sys
import tarfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

kTarPartBytes = 15_000_000


# ---------------------------------------------------------------------------------------------
# Model: a Llama decoder whose parameter names and numerics are those of transformers'
# LlamaForCausalLM, so its state dict exports unchanged.

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # (dim)
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# False when the fused attention kernels reject enable_gqa (probe_sdpa_gqa): K/V are then
# expanded to all query heads before the call instead.
gUseSdpaGqa = True


def probe_sdpa_gqa(device, n_heads, n_kv, head_dim):
    """Whether flash attention takes enable_gqa on this machine (forward and backward)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    try:
        q = torch.randn(1, n_heads, 256, head_dim, device=device, dtype=torch.bfloat16,
                        requires_grad=True)
        kv = torch.randn(1, n_kv, 256, head_dim, device=device, dtype=torch.bfloat16)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            F.scaled_dot_product_attention(q, kv, kv, is_causal=True,
                                           enable_gqa=True).sum().backward()
        return True
    except RuntimeError as e:
        print(f"flash attention with enable_gqa failed ({str(e)[:200]}); expanding K/V instead",
              flush=True)
        return False


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, hd = cfg["hidden_size"], cfg["head_dim"]
        self.n_heads, self.n_kv, self.head_dim = cfg["num_heads"], cfg["num_kv_heads"], hd
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=False)  # (H*hd, d)
        self.k_proj = nn.Linear(d, self.n_kv * hd, bias=False)     # (KV*hd, d)
        self.v_proj = nn.Linear(d, self.n_kv * hd, bias=False)     # (KV*hd, d)
        self.o_proj = nn.Linear(self.n_heads * hd, d, bias=False)  # (d, H*hd)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q = (q * cos + rotate_half(q) * sin).to(v.dtype)
        k = (k * cos + rotate_half(k) * sin).to(v.dtype)
        # Query head h reads kv head h // (H / KV), as transformers' repeat_kv.
        if self.n_kv != self.n_heads and not gUseSdpaGqa:
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.n_kv != self.n_heads)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class Mlp(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, f = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(d, f, bias=False)  # (ffn, d)
        self.up_proj = nn.Linear(d, f, bias=False)    # (ffn, d)
        self.down_proj = nn.Linear(f, d, bias=False)  # (d, ffn)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = Mlp(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])  # (V, d)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg["num_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class LlamaLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Decoder(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)  # (V, d)
        hd = cfg["head_dim"]
        inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (hd/2)

    def rope(self, t, device):
        pos = torch.arange(t, device=device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq.to(device))
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[None, None], emb.sin()[None, None]  # (1, 1, T, hd) each

    def forward(self, tokens):
        """tokens (B, T) int64 -> logits (B, T, V)."""
        x = self.model.embed_tokens(tokens)
        cos, sin = self.rope(tokens.shape[1], tokens.device)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))


def init_weights(model, std, n_layers):
    for name, p in model.named_parameters():
        if p.dim() == 1:
            nn.init.ones_(p)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            # Residual-branch outputs scaled down with depth (GPT-2 style).
            nn.init.normal_(p, mean=0.0, std=std / math.sqrt(2 * n_layers))
        else:
            nn.init.normal_(p, mean=0.0, std=std)


def count_params(cfg):
    d, f, v, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    q, kv = cfg["num_heads"] * hd, cfg["num_kv_heads"] * hd
    per_layer = d * q * 2 + d * kv * 2 + 3 * d * f + 2 * d
    return {"embedding": v * d, "lm_head": v * d, "layers": cfg["num_layers"] * per_layer,
            "final_norm": d, "total": 2 * v * d + cfg["num_layers"] * per_layer + d}


def train_flops_per_token(cfg, seq_len):
    """6 x matmul weights (lm_head included, embedding lookup excluded) + causal attention
    (QK^T and PV: 2 x 2 x T/2 x q_dim per layer forward, x3 for forward + backward)."""
    p = count_params(cfg)
    matmul = 6 * (p["layers"] + p["lm_head"])
    attn = 3 * 2 * 2 * (seq_len / 2) * cfg["num_heads"] * cfg["head_dim"] * cfg["num_layers"]
    return matmul + attn


# ---------------------------------------------------------------------------------------------
# Data

def load_stream(data_dir, meta, split):
    info = meta["splits"][split]
    with lzma.open(os.path.join(data_dir, info["file"]), "rb") as f:
        raw = f.read()
    if hashlib.sha256(raw).hexdigest() != info["sha256"]:
        sys.exit(f"train.py: {info['file']}: sha256 differs from data.json (corrupt copy?)")
    tokens = np.frombuffer(raw, dtype="<u2")
    if len(tokens) != info["tokens"]:
        sys.exit(f"train.py: {info['file']}: {len(tokens)} tokens, data.json says "
                 f"{info['tokens']}")
    return tokens, np.asarray(info["doc_starts"], dtype=np.int64)


class WindowSampler:
    def __init__(self, tokens, doc_starts, seq_len, batch, doc_start_frac, seed, device):
        if len(tokens) < seq_len + 2:
            sys.exit(f"train.py: the train stream has {len(tokens)} tokens, fewer than "
                     f"seq_len + 2 = {seq_len + 2}")
        self.tokens = torch.from_numpy(tokens.astype(np.int32)).to(device)  # (N,) int32
        self.doc_starts = doc_starts
        self.seq_len, self.batch = seq_len, batch
        self.doc_start_frac = doc_start_frac
        self.rng = np.random.default_rng(seed)
        self.offsets = torch.arange(seq_len + 1, device=device)  # (T+1,)
        self.device = device

    def next(self):
        """-> (inputs, targets), each (B, T) int64."""
        hi = len(self.tokens) - self.seq_len - 1
        starts = self.rng.integers(0, hi + 1, size=self.batch)
        snap = self.rng.random(self.batch) < self.doc_start_frac
        doc_idx = np.searchsorted(self.doc_starts, starts, side="right") - 1
        starts = np.where(snap, self.doc_starts[doc_idx], starts)
        starts = np.minimum(starts, hi)
        idx = torch.from_numpy(starts).to(self.device)[:, None] + self.offsets[None, :]
        window = self.tokens[idx].long()
        return window[:, :-1], window[:, 1:]


def eval_windows(n_tokens, seq_len):
    """[(start, length)] of the held-out windows: inputs [s, s+len), targets [s+1, s+len+1)."""
    out = []
    s = 0
    while s < n_tokens - 1:
        length = min(seq_len, n_tokens - 1 - s)
        out.append((s, length))
        s += length
    return out


@torch.no_grad()
def heldout_nll(forward_logits, tokens, seq_len, device, max_windows=None, batch=4):
    """Per-window (nll_sum, n_scored) of the held-out stream.
    forward_logits(ids (B, T) int64) -> logits (B, T, V)."""
    windows = eval_windows(len(tokens), seq_len)
    if max_windows is not None:
        windows = windows[:max_windows]
    data = torch.from_numpy(tokens.astype(np.int64))
    results = []
    i = 0
    while i < len(windows):
        # Windows of the same length go together (all but the last one are full).
        group = [windows[i]]
        while (i + len(group) < len(windows) and len(group) < batch
               and windows[i + len(group)][1] == group[0][1]):
            group.append(windows[i + len(group)])
        length = group[0][1]
        ids = torch.stack([data[s:s + length] for s, _ in group]).to(device)
        tgt = torch.stack([data[s + 1:s + length + 1] for s, _ in group]).to(device)
        logits = forward_logits(ids).float()
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                              reduction="none").view(len(group), length).double().sum(dim=1)
        for j in range(len(group)):
            results.append((float(nll[j]), length))
        i += len(group)
    return results


def summarize_nll(results):
    total = sum(r[0] for r in results)
    count = sum(r[1] for r in results)
    return {"nll_per_token": total / count, "ppl": math.exp(total / count), "tokens": count,
            "windows": len(results)}


# ---------------------------------------------------------------------------------------------
# Export

def hf_config_dict(cfg, bos, eos, seq_len):
    return dict(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                intermediate_size=cfg["intermediate_size"],
                num_hidden_layers=cfg["num_layers"], num_attention_heads=cfg["num_heads"],
                num_key_value_heads=cfg["num_kv_heads"], head_dim=cfg["head_dim"],
                max_position_embeddings=seq_len, rms_norm_eps=cfg["rms_norm_eps"],
                rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]},
                tie_word_embeddings=False, attention_bias=False,
                mlp_bias=False, hidden_act="silu", bos_token_id=bos, eos_token_id=eos,
                initializer_range=cfg["init_std"])


def export_hf(model, cfg, meta, data_dir, export_dir, seq_len):
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    config = LlamaConfig(**hf_config_dict(cfg, meta["bos_token_id"], meta["eos_token_id"],
                                          seq_len))
    hf = LlamaForCausalLM(config)
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    hf = hf.to(torch.bfloat16)
    if os.path.exists(export_dir):
        shutil.rmtree(export_dir)
    os.makedirs(export_dir)
    hf.save_pretrained(export_dir, max_shard_size="15MB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(data_dir, name), os.path.join(export_dir, name))
    import transformers
    gen = {"_from_model_config": False, "bos_token_id": meta["bos_token_id"],
           "eos_token_id": meta["eos_token_id"], "transformers_version": transformers.__version__}
    with open(os.path.join(export_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")


def load_exported(export_dir, device):
    """Reloads the export as transformers would (float32 compute over the bf16 weights)."""
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32,
                                              attn_implementation="sdpa")
    return hf.to(device).eval()


def check_export(export_dir, model, device, vocab_size):
    """Logits of the reloaded export against the training model's (bf16-rounded weights)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(export_dir, "tokenizer.json"))
    text = "The quick brown fox jumps over the lazy dog.\nint main(void) { return 0; }\n"
    enc = tok.encode(text)
    if enc.ids[0] != model.cfg["bos_id"] or max(enc.ids) >= vocab_size:
        raise RuntimeError(f"tokenizer reload: unexpected ids {enc.ids[:8]}")
    if tok.decode(enc.ids, skip_special_tokens=True) != text:
        raise RuntimeError("tokenizer reload: decode(encode(text)) != text")
    hf = load_exported(export_dir, device)
    ids = torch.tensor([enc.ids], device=device)
    ref = LlamaLM(model.cfg).to(device)
    ref.load_state_dict({k: v.detach().to(torch.bfloat16).float()
                         for k, v in model.state_dict().items()})
    with torch.no_grad():
        a = hf(input_ids=ids).logits.float()
        b = ref(ids).float()
    diff = (a - b).abs().max().item()
    if not diff < 1e-3 * max(1.0, b.abs().max().item()):
        raise RuntimeError(f"exported model's logits differ from the training model's by {diff}")
    return hf, tok, diff


def sample_text(hf, tok, device, prompt, n_new):
    """Greedy continuation with a plain loop (no generate() API differences between versions)."""
    ids = torch.tensor([tok.encode(prompt).ids], device=device)
    with torch.no_grad():
        for _ in range(n_new):
            nxt = hf(input_ids=ids).logits[0, -1].argmax().view(1, 1)
            ids = torch.cat([ids, nxt], dim=1)
    return tok.decode(ids[0].tolist(), skip_special_tokens=True)


def write_tar(export_dir, out_tar):
    """One tar of the export (files at its root), split into parts of <= kTarPartBytes bytes
    named OUT_TAR.partNN; returns [(name, bytes)], sha256 of the whole tar."""
    os.makedirs(os.path.dirname(os.path.abspath(out_tar)), exist_ok=True)
    tmp = out_tar + ".tmp"
    with tarfile.open(tmp, "w") as tar:
        for name in sorted(os.listdir(export_dir)):
            tar.add(os.path.join(export_dir, name), arcname=name)
    digest = hashlib.sha256()
    parts = []
    with open(tmp, "rb") as f:
        while True:
            chunk = f.read(kTarPartBytes)
            if not chunk:
                break
            digest.update(chunk)
            name = f"{out_tar}.part{len(parts):02d}"
            with open(name, "wb") as p:
                p.write(chunk)
            parts.append((os.path.basename(name), len(chunk)))
    os.remove(tmp)
    return parts, digest.hexdigest()


def dump_state(model, cfg, path):
    """Emergency save: the bf16 state dict and config as PATH.partNN (<= kTarPartBytes each)."""
    import io
    buf = io.BytesIO()
    torch.save({"cfg": cfg, "state_dict": {k: v.detach().to(torch.bfloat16).cpu()
                                           for k, v in model.state_dict().items()}}, buf)
    data = buf.getvalue()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    for i in range(0, len(data), kTarPartBytes):
        with open(f"{path}.part{i // kTarPartBytes:02d}", "wb") as f:
            f.write(data[i:i + kTarPartBytes])
    print(f"saved the trained weights to {path}.part* ({len(data):,} bytes; "
          "cat the parts, torch.load)", flush=True)


# ---------------------------------------------------------------------------------------------
# Model card

def model_card(m):
    c, t, r, d = m["config"], m["training"], m["results"], m["data"]
    p = m["params"]
    lines = [
        f"# {m['name']}",
        "",
        "A small Llama-architecture language model trained from scratch for quantspec's tests, "
        "demos and speculative-decoding measurements. It is a toy by design: "
        f"{p['total'] / 1e6:.1f} M parameters trained for {t['train_time_s'] / 60:.1f} minutes "
        f"on one {t['device']}, on English technical documentation, the King James Bible and "
        "some code. "
        "Expect locally fluent, often meaningless text.",
        "",
        "## Architecture",
        "",
        "| field | value |",
        "|---|---|",
        "| class | LlamaForCausalLM (pre-norm RMSNorm, SwiGLU MLP, RoPE, GQA, no biases) |",
        f"| parameters | {p['total']:,} (embedding {p['embedding']:,}, untied lm_head "
        f"{p['lm_head']:,}, {c['num_layers']} layers {p['layers']:,}) |",
        f"| hidden / intermediate | {c['hidden_size']} / {c['intermediate_size']} |",
        f"| layers | {c['num_layers']} |",
        f"| heads / KV heads / head_dim | {c['num_heads']} / {c['num_kv_heads']} / "
        f"{c['head_dim']} |",
        f"| vocabulary | {c['vocab_size']} (byte-level BPE; bos `<\\|begin_of_text\\|>` = "
        f"{d['bos_token_id']}, eos `<\\|end_of_text\\|>` = {d['eos_token_id']}) |",
        f"| RoPE theta | {c['rope_theta']:g} (no scaling) |",
        f"| context | trained at {t['seq_len']} tokens; max_position_embeddings "
        f"{t['seq_len']} |",
        "| weights | bfloat16 safetensors, shards <= 15 MB |",
        "",
        "## Training data",
        "",
        "Built by `tools/train/build_corpus.py` only from Debian 12 (bookworm) packages; the "
        "text is not redistributed here. Documents shorter than "
        f"{d['min_doc_tokens']} tokens were dropped; exact and near duplicates removed; "
        f"{d['heldout_frac'] * 100:.0f}% of the documents of each source held out (seeded).",
        "",
        "| source | Debian packages (version) | license | train docs | train tokens | "
        "held-out docs | held-out tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in d["sources"]:
        pk = ", ".join(f"{k} ({v})" for k, v in s["packages"].items())
        tk = d["tokens_per_source"].get(s["name"], {})
        if not tk.get("train_tokens") and not tk.get("heldout_tokens"):
            continue
        lines.append(f"| {s['name']}: {s['description']} | {pk} | {s['license']} | "
                     f"{tk.get('train_docs', 0)} | {tk.get('train_tokens', 0):,} | "
                     f"{tk.get('heldout_docs', 0)} | {tk.get('heldout_tokens', 0):,} |")
    lines += [
        f"| **total** | | | {d['train_docs']} | {d['train_tokens']:,} | {d['heldout_docs']} | "
        f"{d['heldout_tokens']:,} |",
        "",
        "The tokenizer (`tokenizer.json`, Llama-3 structure: Split with the Llama-3 regex, "
        "ByteLevel, BPE with ignore_merges, BOS added by the post-processor) was trained on the "
        "train split with the `tokenizers` library by `tools/train/prepare_data.py`.",
        "",
        "## Training",
        "",
        "| field | value |",
        "|---|---|",
        f"| hardware | {t['device']} |",
        f"| software | torch {t['torch']}, transformers {t['transformers']}, "
        f"torch.compile {'on' if t['compiled'] else 'off'} |",
        f"| steps | {t['steps']} |",
        f"| batch | {t['batch']} x {t['seq_len']} tokens = {t['batch'] * t['seq_len']:,} "
        "tokens per step |",
        f"| tokens seen | {t['tokens_seen']:,} ({t['tokens_seen'] / d['train_tokens']:.1f} "
        "passes over the train split) |",
        f"| optimizer | AdamW{' (fused)' if t['fused_adamw'] else ''}, betas "
        f"({t['beta1']}, {t['beta2']}), weight decay "
        f"{t['weight_decay']} (matrices only), grad clip {t['grad_clip']} |",
        f"| learning rate | peak {t['lr']:g}, linear warmup {t['warmup_steps']} steps, cosine to "
        f"{t['lr'] * t['min_lr_ratio']:g} over the time budget |",
        f"| precision | {t['precision']} |",
        f"| training windows | random offsets; {t['doc_start_frac'] * 100:.0f}% moved back to a "
        "document start |",
        f"| wall time | {t['train_time_s']:.0f} s of training, {t['tokens_per_s']:,.0f} tokens/s "
        f"(~{t['achieved_tflops']:.0f} TFLOP/s at {t['flops_per_token'] / 1e6:.0f} MFLOP/token) |",
        f"| seed | {t['seed']} |",
        "",
        "## Results",
        "",
        f"- final train loss: {r['final_train_loss']:.4f} (mean of the last "
        f"{r['final_train_loss_steps']} steps; {math.exp(r['final_train_loss']):.2f} ppl)",
        f"- held-out perplexity: **{r['heldout']['ppl']:.4f}** "
        f"({r['heldout']['nll_per_token']:.5f} nats/token) over {r['heldout']['tokens']:,} "
        f"tokens in {r['heldout']['windows']} windows",
        "",
        "Method: the held-out stream (`heldout.u16`: raw little-endian uint16 token ids, "
        "documents as `<|begin_of_text|> ... <|end_of_text|>` concatenated) is cut into "
        f"consecutive windows of T = {t['seq_len']} tokens; window k feeds tokens "
        "[kT, kT+T) from an empty cache and scores the predictions of tokens [kT+1, kT+T+1) "
        "(the last window is shorter), so every token but the first is scored once. "
        "ppl = exp(sum NLL / scored tokens). Computed from the exported bf16 weights with "
        "transformers' LlamaForCausalLM in float32; per-window NLL sums are in "
        "`metrics.json`. The training model under bf16 autocast gave "
        f"{r['heldout_train_model_bf16']['ppl']:.4f}.",
        "",
    ]
    if m.get("sample"):
        lines += ["## Sample (greedy)", "", "```", m["sample"].strip(), "```", ""]
    lines += [
        "## Licenses",
        "",
        "The model was trained on the texts listed above, each under the license shown there; "
        "none of that text is included in this folder except `heldout.u16`, the token ids of "
        "the held-out documents (kept for the perplexity check).",
        "",
        "## Reproduce",
        "",
        "```sh",
        "apt-get install -y $(tools/train/build_corpus.py --print-packages)",
        "tools/train/build_corpus.py           # -> .train/corpus/",
        "tools/train/prepare_data.py           # -> .train/gpu/ (tokenizer + token streams)",
        "# on the GPU machine, with .train/gpu carried (tools/train/run_gpu.sh):",
        f"python3 tools/train/train.py {m['command_args']}",
        "```",
        "",
        f"Trained {m['date']}.",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=".train/gpu")
    ap.add_argument("--name", default="qs-tiny-16k")
    ap.add_argument("--export-dir", required=True)
    ap.add_argument("--out-tar", default="", help="write EXPORT as OUT_TAR.partNN (<= 15 MB each)")
    ap.add_argument("--hidden-size", type=int, default=384)
    ap.add_argument("--intermediate-size", type=int, default=1024)
    ap.add_argument("--num-layers", type=int, default=6)
    ap.add_argument("--num-heads", type=int, default=6)
    ap.add_argument("--num-kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--rms-norm-eps", type=float, default=1e-5)
    ap.add_argument("--init-std", type=float, default=0.02)
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--time-budget-s", type=float, default=420.0,
                    help="training-loop wall time (compilation included); 0 = no limit")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=60)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--doc-start-frac", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--compile", choices=["on", "off"], default="on",
                    help="torch.compile the model (falls back to eager if it fails)")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--eval-every-s", type=float, default=100.0,
                    help="held-out loss on a few windows every this many seconds")
    ap.add_argument("--max-eval-windows", type=int, default=0, help="0 = all (tests use a few)")
    ap.add_argument("--sample-tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    t_script = time.time()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    device = torch.device(args.device)
    use_bf16 = device.type == "cuda"
    torch.set_float32_matmul_precision("high")  # TF32 for the few fp32 matmuls in training

    with open(os.path.join(args.data, "data.json")) as f:
        meta = json.load(f)
    train_tokens, train_starts = load_stream(args.data, meta, "train")
    held_tokens, _ = load_stream(args.data, meta, "heldout")
    cfg = {"vocab_size": meta["vocab_size"], "hidden_size": args.hidden_size,
           "intermediate_size": args.intermediate_size, "num_layers": args.num_layers,
           "num_heads": args.num_heads, "num_kv_heads": args.num_kv_heads,
           "head_dim": args.head_dim, "rope_theta": args.rope_theta,
           "rms_norm_eps": args.rms_norm_eps, "init_std": args.init_std,
           "bos_id": meta["bos_token_id"]}
    if args.num_heads % args.num_kv_heads:
        sys.exit("train.py: --num-heads must be a multiple of --num-kv-heads")
    params = count_params(cfg)
    flops_tok = train_flops_per_token(cfg, args.seq_len)
    print(f"data: train {len(train_tokens):,} tokens in {len(train_starts)} documents, held-out "
          f"{len(held_tokens):,} tokens; vocab {cfg['vocab_size']}", flush=True)
    print(f"model: {params['total']:,} parameters ({params['total'] * 2 / 1e6:.1f} MB bf16); "
          f"{flops_tok / 1e6:.0f} MFLOP per training token at T={args.seq_len}", flush=True)
    device_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else f"CPU ({platform.machine()})")
    print(f"device: {device} ({device_name}); torch {torch.__version__}", flush=True)

    global gUseSdpaGqa
    if device.type == "cuda" and args.num_kv_heads != args.num_heads:
        gUseSdpaGqa = probe_sdpa_gqa(device, args.num_heads, args.num_kv_heads, args.head_dim)
    model = LlamaLM(cfg).to(device)
    init_weights(model, args.init_std, args.num_layers)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed_tokens" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "embed_tokens" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(args.beta1, args.beta2), eps=1e-8,
                            fused=device.type == "cuda")
    sampler = WindowSampler(train_tokens, train_starts, args.seq_len, args.batch,
                            args.doc_start_frac, args.seed, device)

    def loss_fn(m, inputs, targets):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = m(inputs)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    compiled = args.compile == "on"

    def eager_step_loss(inputs, targets):
        return loss_fn(model, inputs, targets)

    # The loss is compiled with the model so the cross-entropy fuses with the lm_head output.
    step_loss = torch.compile(eager_step_loss) if compiled else eager_step_loss

    def eval_quick(n_windows):
        model.eval()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            res = heldout_nll(model, held_tokens, args.seq_len, device, max_windows=n_windows)
        model.train()
        return summarize_nll(res)

    def lr_at(step, progress):
        warm = min(1.0, (step + 1) / max(1, args.warmup_steps))
        cos = args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi *
                                                                             min(1.0, progress)))
        return args.lr * warm * cos

    budget = args.time_budget_s if args.time_budget_s > 0 else float("inf")
    losses = []
    history = []
    step = 0
    tokens_per_step = args.batch * args.seq_len
    t_loop = time.time()
    t_first = None  # end of the first step (compilation) - the schedule's time origin
    last_eval = t_loop
    progress = 0.0
    print(f"training: {args.batch} x {args.seq_len} tokens per step, time budget "
          f"{args.time_budget_s:.0f} s, compile {args.compile}", flush=True)
    while step < args.max_steps:
        now = time.time()
        if now - t_loop >= budget:
            break
        if t_first is not None:
            avail = max(1e-6, budget - (t_first - t_loop))
            progress = max(step / args.max_steps, (now - t_first) / avail)
            if progress >= 1.0:
                break
        else:
            progress = step / args.max_steps
        lr = lr_at(step, progress)
        for g in opt.param_groups:
            g["lr"] = lr
        inputs, targets = sampler.next()
        try:
            loss = step_loss(inputs, targets)
            loss.backward()
        except Exception as e:  # noqa: BLE001 - any compiler failure falls back to eager
            if not compiled or step > 0:
                raise
            print(f"torch.compile failed ({type(e).__name__}: {str(e)[:300]}); "
                  "continuing in eager mode", flush=True)
            compiled = False
            step_loss = eager_step_loss
            opt.zero_grad(set_to_none=True)
            loss = step_loss(inputs, targets)
            loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if t_first is None:
            loss_v = loss.item()
            t_first = time.time()
            print(f"step 1 (compilation and warm-up) took {t_first - t_loop:.1f} s; "
                  f"loss {loss_v:.4f}", flush=True)
        if step % args.log_every == 0 or step <= 3:
            loss_v = loss.item()
            elapsed = time.time() - t_first
            tps = (step - 1) * tokens_per_step / elapsed if elapsed > 0 and step > 1 else 0.0
            print(f"step {step:5d}  loss {loss_v:.4f}  lr {lr:.2e}  gnorm {gnorm.item():.3f}  "
                  f"{tps:,.0f} tok/s  {tps * flops_tok / 1e12:.0f} TFLOP/s  "
                  f"t {time.time() - t_loop:.0f} s  progress {progress:.3f}", flush=True)
            history.append({"step": step, "loss": loss_v, "lr": lr,
                            "time_s": time.time() - t_loop})
        losses.append(loss.detach())
        if args.eval_every_s > 0 and time.time() - last_eval >= args.eval_every_s:
            q = eval_quick(4)
            print(f"  held-out (4 windows): loss {q['nll_per_token']:.4f}  ppl {q['ppl']:.3f}",
                  flush=True)
            history.append({"step": step, "heldout_loss_4win": q["nll_per_token"],
                            "time_s": time.time() - t_loop})
            last_eval = time.time()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t_end = time.time()
    if step == 0:
        sys.exit("train.py: no training step ran (time budget too small?)")
    train_time = t_end - t_loop
    timed = t_end - t_first if step > 1 else train_time
    tps = (step - 1) * tokens_per_step / timed if step > 1 else tokens_per_step / train_time
    last = torch.stack(losses[-20:]).float()
    final_loss = float(last.mean())
    print(f"done: {step} steps, {step * tokens_per_step:,} tokens in {train_time:.0f} s "
          f"({tps:,.0f} tok/s); final train loss {final_loss:.4f}", flush=True)

    try:
        max_w = args.max_eval_windows or None
        model.eval()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            res_train = summarize_nll(heldout_nll(model, held_tokens, args.seq_len, device,
                                                  max_windows=max_w))
        print(f"held-out (training model, bf16 autocast): ppl {res_train['ppl']:.4f} over "
              f"{res_train['tokens']:,} tokens", flush=True)

        export_dir = args.export_dir
        export_hf(model, cfg, meta, args.data, export_dir, args.seq_len)
        torch.set_float32_matmul_precision("highest")  # float32 reference from here on
        hf, tok, diff = check_export(export_dir, model, device, cfg["vocab_size"])
        print(f"export reloaded with AutoModelForCausalLM; max |logit diff| vs training model "
              f"{diff:.2e}", flush=True)
        per_window = heldout_nll(lambda ids: hf(input_ids=ids).logits, held_tokens, args.seq_len,
                                 device, max_windows=max_w, batch=1)
        res_hf = summarize_nll(per_window)
        print(f"held-out perplexity (exported bf16 weights, float32): {res_hf['ppl']:.4f} over "
              f"{res_hf['tokens']:,} tokens in {res_hf['windows']} windows", flush=True)
        scored = sum(r[1] for r in per_window) + 1
        held_tokens[:scored].astype("<u2").tofile(os.path.join(export_dir, "heldout.u16"))

        sample = ""
        if args.sample_tokens > 0:
            try:
                sample = sample_text(hf, tok, device, "The", args.sample_tokens)
            except Exception as e:  # noqa: BLE001 - a sample is decoration, never a failure
                print(f"sample failed: {e}", flush=True)

        import transformers
        summary = meta["corpus"]
        tps_src = meta["tokens_per_source"]
        metrics = {
            "name": args.name,
            "date": datetime.date.today().isoformat(),
            "command_args": " ".join(a for a in sys.argv[1:]),
            "config": cfg, "params": params,
            "data": {"sources": summary["sources"], "tokens_per_source": tps_src,
                     "heldout_frac": summary["heldout_frac"],
                     "min_doc_tokens": meta["min_doc_tokens"],
                     "bos_token_id": meta["bos_token_id"], "eos_token_id": meta["eos_token_id"],
                     "train_docs": meta["splits"]["train"]["docs"],
                     "train_tokens": meta["splits"]["train"]["tokens"],
                     "heldout_docs": meta["splits"]["heldout"]["docs"],
                     "heldout_tokens": meta["splits"]["heldout"]["tokens"],
                     "heldout_sha256": meta["splits"]["heldout"]["sha256"]},
            "training": {"steps": step, "batch": args.batch, "seq_len": args.seq_len,
                         "tokens_seen": step * tokens_per_step, "train_time_s": train_time,
                         "first_step_s": t_first - t_loop, "tokens_per_s": tps,
                         "flops_per_token": flops_tok, "achieved_tflops": tps * flops_tok / 1e12,
                         "lr": args.lr, "min_lr_ratio": args.min_lr_ratio,
                         "warmup_steps": args.warmup_steps, "weight_decay": args.weight_decay,
                         "beta1": args.beta1, "beta2": args.beta2, "grad_clip": args.grad_clip,
                         "doc_start_frac": args.doc_start_frac, "seed": args.seed,
                         "compiled": compiled, "time_budget_s": args.time_budget_s,
                         "fused_adamw": device.type == "cuda",
                         "precision": ("bf16 autocast, fp32 master weights" if use_bf16
                                       else "float32"),
                         "device": device_name,
                         "torch": torch.__version__, "transformers": transformers.__version__,
                         "history": history},
            "results": {"final_train_loss": final_loss, "final_train_loss_steps": len(last),
                        "heldout": res_hf, "heldout_train_model_bf16": res_train,
                        "export_max_logit_diff": diff,
                        "heldout_windows": [{"start": i * args.seq_len, "nll_sum": r[0],
                                             "scored": r[1]} for i, r in enumerate(per_window)],
                        "heldout_file": "heldout.u16", "heldout_file_tokens": scored},
            "sample": sample,
        }
        with open(os.path.join(export_dir, "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=1)
            f.write("\n")
        with open(os.path.join(export_dir, "README.md"), "w") as f:
            f.write(model_card(metrics))

        for n in os.listdir(export_dir):
            os.chmod(os.path.join(export_dir, n), 0o644)  # save_pretrained writes some 0600
        sizes = {n: os.path.getsize(os.path.join(export_dir, n)) for n in os.listdir(export_dir)}
        too_big = [n for n, s in sizes.items() if s > 15_000_000]
        if too_big:
            raise RuntimeError(f"export files over 15 MB: {too_big}")
        print(f"export: {export_dir}: {len(sizes)} files, {sum(sizes.values()) / 1e6:.1f} MB",
              flush=True)
        if args.out_tar:
            parts, digest = write_tar(export_dir, args.out_tar)
            print(f"tar: {' '.join(f'{n} ({s:,} B)' for n, s in parts)}; sha256 {digest}",
                  flush=True)
        print(f"SUMMARY name={args.name} params={params['total']} steps={step} "
              f"tokens={step * tokens_per_step} tok/s={tps:.0f} final_train_loss={final_loss:.4f} "
              f"heldout_ppl={res_hf['ppl']:.4f} heldout_ppl_train_model={res_train['ppl']:.4f} "
              f"compiled={compiled} total_time={time.time() - t_script:.0f}s", flush=True)
    except BaseException:
        # Whatever failed after training, keep the weights: they cost the whole GPU budget.
        if args.out_tar:
            dump_state(model, cfg, args.out_tar + ".state.pt")
        raise


if __name__ == "__main__":
    main()
