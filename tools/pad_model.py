#!/usr/bin/env python3
"""Embed a small trained Llama into a large-shape Llama that computes the same function.

Speed at 7B/8B memory traffic with the small model's real acceptance rate (issue #6): the padded
model reads the weight and KV bytes of Llama-2-7B / Llama-3.1-8B per token while its logits are
the small model's (models/default = models/qs-tiny-16k), so QuantSpec accepts what the small
model accepts.

  python3 tools/pad_model.py --shape llama3.1-8b --out /tmp/qs-padded-llama3.1-8b
  python3 tools/pad_model.py --shape custom --hidden 512 --layers 8 --heads 16 --kv-heads 4 \\
      --inter 2048 --vocab 9000 --out /tmp/m          [--src models/default]

Shapes (head_dim the small model's 64, so RoPE and the softmax scale 1/sqrt(64) are exact; the
-hd128 ones have the real models' head_dim 128, see "Doubled heads" below):
  llama2-7b    hidden 4096, 32 layers, 64 q / 64 kv heads, inter 11008, vocab 32000
               (weight bytes and KV bytes per token = Llama-2-7B's)
  llama3.1-8b  hidden 4096, 32 layers, 64 q / 16 kv heads, inter 14336, vocab 128256
               (= Llama-3.1-8B's)
  llama2-7b-hd128, llama3.1-8b-hd128: the same with 32 q / 32 kv and 32 q / 8 kv heads of 128,
               exactly Llama-2-7B's and Llama-3.1-8B's attention shapes

Construction (small: hidden h, vocab v, ...; large: H, V, ...; r = h / H):
- Residual stream: the small dims are dims [0, h) of the large stream. Every weight that writes
  to the residual (embedding columns, o_proj rows, down_proj rows) is 0 outside [0, h), so dims
  >= h stay exactly 0 in every layer. Embedding rows [0, v) are the small rows padded with zeros;
  rows of the extra vocab entries are 0.
- RMSNorm: over H dims, mean(x^2) is r times the small model's. With eps' = eps * r,
  1/sqrt(r*mean + r*eps) = (1/sqrt(r)) / sqrt(mean + eps), so every norm weight is multiplied by
  sqrt(r) (not 1/sqrt(r)). sqrt(r) times a bf16 value is not a bf16 value, so the norm weights
  (vectors, negligible bytes) are stored as F32 tensors; the matrices keep the source dtype
  (bf16). Norm weights of the padding dims are 1 (they multiply zeros). quantspec takes a dtype
  per tensor; transformers does too, but casts to its torch_dtype at load (load with
  torch_dtype=float32 to keep the norms exact there).
- Attention: small q head i -> large q head P(i); large kv head j serves large q heads
  [j*g, (j+1)*g), g = heads / kv_heads, and holds the k/v rows of the small kv head its used q
  heads use (small q head i uses small kv head i // (small heads / small kv heads)). P is the
  identity (contiguous) whenever that is consistent: then o_proj's 128-column groups hold the
  small model's columns exactly and the 4-bit draft quantizes every matrix identically (the MHA
  shape llama2-7b). Otherwise (the GQA shape llama3.1-8b, g = 4: small heads 0..2 use small kv
  head 0 and 3..5 kv head 1) each small kv head gets its own block of large kv heads and its q
  heads are placed at the start of that block: 0,1,2 -> 0,1,2 and 3,4,5 -> 4,5,6. Then the int4
  draft of o_proj groups its columns differently from the small model's (a group mixes real
  columns with zero columns of unused heads, whose 4-bit values need not be exactly 0), so the
  draft, and with it the acceptance, can differ slightly; the target logits stay exact.
  q/k/v/o of unused heads are 0 (an unused q head attends uniformly, its o_proj columns are 0).
- MLP: intermediate rows/columns beyond the small ones are 0 (silu(0) * 0 = 0).
- Layers beyond the small model's (appended after them) are all 0: residual + 0, an identity;
  their norms are 1.
- lm_head: rows [0, v) are the small rows padded with zeros; the other rows are 0, so the logits
  of the extra vocab entries are exactly 0. Greedy decoding is therefore unaffected whenever the
  top real logit is > 0 (else an extra id, >= v, would win); sampling gives the extra ids
  probability exp(0 - logsumexp) each, so only greedy/top-k-equivalent use is exact.
  tie_word_embeddings is the small model's (tied: the padded embedding serves both).
- RoPE (rope_theta, rope_parameters/rope_scaling) is copied from the small model (so the
  llama3.1-8b shape has no llama3 rope scaling); max_position_embeddings = max(small's, 131072).
  The small model was trained at 16K context: acceptance beyond that measures an extrapolating
  model.
What differs from the real 7B/8B models: head_dim 64 instead of 128 (twice the heads at the same
bytes), so attention kernels run another head shape and the INT8/INT4 KV metadata (per head and
group) is a little larger; the per-token weight and KV-code bytes are the real models'.
Doubled heads (--head-dim 128 from a head_dim-64 model, the -hd128 shapes): small head dims
[0, 32) and [32, 64) (the halves RoPE pairs) go to dims [0, 32) and [64, 96) of a 128-dim head,
the rest 0. rope_theta becomes theta^2, so pair d of 128 turns at theta^(-2d/64) as pair d of the
small head did, and rope_parameters are yarn with factor 1 (frequencies unchanged) and
attention_factor 2^(1/4): transformers scales cos and sin by it, so the scores by sqrt(2), and
1/sqrt(128) becomes the small model's 1/sqrt(64). The logits match the small model's to f32
rounding (the frequencies are computed from another theta; tests/cli/test_pad_model.py); the
4-bit draft's o_proj groups then mix real and zero columns, so its acceptance can differ slightly.
All-zero 128-column groups quantize to exactly 0 in the 4-bit draft (scale 0, min 0) and all-zero
KV heads to exactly 0 in the INT8/INT4 cache, so the padding adds bytes, not errors.

Output: model-XXXXX-of-YYYYY.safetensors (embedding, one shard per layer, final norm +
lm_head), model.safetensors.index.json, tokenizer/generation files copied from the source,
padding.json (source, shape, head placement) and, last, config.json (so its presence marks a
complete model). Shards are written one at a time, row chunks
of <= 64 MB at a time, so memory stays bounded (the llama3.1-8b output is ~16 GB). The zeros are
really written (not sparse-file holes): holes would all map the one shared zero page, and a CPU
run would then not read the bytes it claims to. Needs only numpy.
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SHAPES = {
    # name: hidden, layers, heads, kv_heads, inter, vocab, head_dim (None: the small model's)
    "llama2-7b": (4096, 32, 64, 64, 11008, 32000, None),
    "llama3.1-8b": (4096, 32, 64, 16, 14336, 128256, None),
    "llama2-7b-hd128": (4096, 32, 32, 32, 11008, 32000, 128),
    "llama3.1-8b-hd128": (4096, 32, 32, 8, 14336, 128256, 128),
}
MIN_MAX_POSITION = 131072
CHUNK_BYTES = 64 << 20
COPY_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
              "tokenizer.model", "special_tokens_map.json", "chat_template.jinja")
RAW = {"BF16": np.uint16, "F16": np.uint16, "F32": np.uint32}
ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4}


def fail(msg):
    sys.exit(f"pad_model: error: {msg}")


# ---------------------------------------------------------------------------------------------
# Reading the source model (safetensors, single or sharded)

class Source:
    def __init__(self, d):
        self.dir = d
        self.tensors = {}  # name -> (path, dtype, shape, absolute offset)
        idx = os.path.join(d, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        elif os.path.exists(os.path.join(d, "model.safetensors")):
            files = ["model.safetensors"]
        else:
            fail(f"{d}: no model.safetensors(.index.json)")
        for fn in files:
            path = os.path.join(d, fn)
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                if info["dtype"] not in RAW:
                    fail(f"{path}: tensor {name} has dtype {info['dtype']} (F32/F16/BF16 only)")
                self.tensors[name] = (path, info["dtype"], tuple(info["shape"]),
                                      8 + n + info["data_offsets"][0])

    def has(self, name):
        return name in self.tensors

    def raw(self, name, shape):
        """The tensor as raw unsigned ints of its element size (a read-only memmap)."""
        if name not in self.tensors:
            fail(f"{self.dir}: missing tensor {name}")
        path, dtype, got, off = self.tensors[name]
        if got != tuple(shape):
            fail(f"{self.dir}: tensor {name} has shape {list(got)}, expected {list(shape)}")
        return dtype, np.memmap(path, dtype=RAW[dtype], mode="r", offset=off, shape=got)

    def f32(self, name, shape):
        dtype, a = self.raw(name, shape)
        if dtype == "BF16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        if dtype == "F16":
            return a.view(np.float16).astype(np.float32)
        return a.view(np.float32).copy()


# ---------------------------------------------------------------------------------------------
# Tensors of the output: a shape, a dtype and how to produce its bytes chunk by chunk

class Placed:
    """A 2-D tensor of zeros with blocks of source matrices copied in:
    blocks = [(src_raw, dst_row0, dst_col0, src_row0, src_col0, n_rows, n_cols)]."""

    def __init__(self, dtype, shape, blocks=()):
        self.dtype, self.shape, self.blocks = dtype, tuple(shape), list(blocks)

    def nbytes(self):
        return self.shape[0] * self.shape[1] * ITEMSIZE[self.dtype]

    def write(self, f, zero_chunk):
        rows, cols = self.shape
        step = max(1, CHUNK_BYTES // (cols * ITEMSIZE[self.dtype]))
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            hits = [b for b in self.blocks if b[1] < r1 and b[1] + b[5] > r0]
            if not hits:
                f.write(zero_chunk(self.dtype, (r1 - r0) * cols))
                continue
            buf = np.zeros((r1 - r0, cols), dtype=RAW[self.dtype])
            for src, dr, dc, sr, sc, nr, nc in hits:
                a, b = max(r0, dr), min(r1, dr + nr)
                buf[a - r0:b - r0, dc:dc + nc] = src[sr + a - dr:sr + b - dr, sc:sc + nc]
            f.write(buf.data)


class Vector:
    """A 1-D F32 tensor."""

    def __init__(self, values):
        self.dtype, self.shape = "F32", (len(values),)
        self.values = np.ascontiguousarray(values, dtype=np.float32)

    def nbytes(self):
        return self.values.nbytes

    def write(self, f, zero_chunk):
        f.write(self.values.data)


class ZeroChunks:
    def __init__(self):
        self.cache = {}

    def __call__(self, dtype, n):
        a = self.cache.get(n * ITEMSIZE[dtype])
        if a is None:
            a = np.zeros(n * ITEMSIZE[dtype], dtype=np.uint8)
            self.cache = {a.nbytes: a}
        return a.data


def write_safetensors(path, tensors, zero_chunk):
    """tensors: list of (name, Placed | Vector), written in order."""
    header, offset = {}, 0
    for name, t in tensors:
        header[name] = {"dtype": t.dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + t.nbytes()]}
        offset += t.nbytes()
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, t in tensors:
            t.write(f, zero_chunk)
    return offset


# ---------------------------------------------------------------------------------------------
# The construction

def place_heads(s_heads, s_kv, heads, kv_heads):
    """Small q head i -> large q head P[i], and large kv head j -> small kv head (or None)."""
    s_group, g = s_heads // s_kv, heads // kv_heads

    def kv_map(P):
        m = [None] * kv_heads
        for i, p in enumerate(P):
            j, k = p // g, i // s_group
            if m[j] is not None and m[j] != k:
                return None
            m[j] = k
        return m

    if s_heads <= heads:
        contiguous = list(range(s_heads))
        m = kv_map(contiguous)
        if m is not None:
            return contiguous, m, True
    # One block of ceil(s_group / g) large kv heads per small kv head, its q heads at its start.
    blocks = -(-s_group // g)
    if s_kv * blocks > kv_heads:
        fail(f"{heads} q heads / {kv_heads} kv heads cannot hold the small model's {s_heads} q / "
             f"{s_kv} kv heads (needs {s_kv * blocks} kv heads of group {g})")
    P = [(i // s_group) * blocks * g + i % s_group for i in range(s_heads)]
    m = kv_map(P)
    assert m is not None
    return P, m, False


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("--src", default=os.path.join(REPO, "models", "default"),
                    help="small Llama model directory (default: models/default)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES) + ["custom"])
    for k in ("hidden", "layers", "heads", "kv-heads", "inter", "vocab"):
        ap.add_argument(f"--{k}", type=int, help="--shape custom")
    ap.add_argument("--head-dim", type=int,
                    help="--shape custom: the small model's head_dim (default) or twice it")
    ap.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    args = ap.parse_args()

    if args.shape == "custom":
        vals = (args.hidden, args.layers, args.heads, args.kv_heads, args.inter, args.vocab)
        if any(v is None or v <= 0 for v in vals):
            fail("--shape custom needs --hidden --layers --heads --kv-heads --inter --vocab > 0")
        H, L, NH, NKV, I, V = vals
        HD = args.head_dim
    else:
        H, L, NH, NKV, I, V, HD = SHAPES[args.shape]

    with open(os.path.join(args.src, "config.json")) as f:
        scfg = json.load(f)
    if scfg.get("model_type", "llama") != "llama" and "LlamaForCausalLM" not in scfg.get(
            "architectures", []):
        fail(f"{args.src}: not a Llama model")
    if scfg.get("attention_bias") or scfg.get("mlp_bias"):
        fail(f"{args.src}: biases are not supported")
    h, l, nh = scfg["hidden_size"], scfg["num_hidden_layers"], scfg["num_attention_heads"]
    nkv = scfg.get("num_key_value_heads", nh)
    hd = scfg.get("head_dim") or h // nh
    HD = HD or hd
    if HD not in (hd, 2 * hd):
        fail(f"--head-dim {HD}: the small model's head_dim ({hd}) or twice it")
    doubled = HD == 2 * hd
    small_rope = scfg.get("rope_parameters") or scfg.get("rope_scaling") or {}
    if doubled and small_rope.get("rope_type", small_rope.get("type", "default")) != "default":
        fail("--head-dim twice the small model's needs its rope without scaling")
    i_s, v = scfg["intermediate_size"], scfg["vocab_size"]
    tied = bool(scfg.get("tie_word_embeddings", False))
    eps = float(scfg.get("rms_norm_eps", 1e-6))

    for what, big, small in (("hidden", H, h), ("layers", L, l), ("inter", I, i_s),
                             ("vocab", V, v), ("heads", NH, nh)):
        if big < small:
            fail(f"--{what} {big} is smaller than the small model's {small}")
    if NH % NKV != 0:
        fail(f"--heads {NH} must be a multiple of --kv-heads {NKV}")
    P, kv_src, contiguous = place_heads(nh, nkv, NH, NKV)
    # o_proj's 128-column groups hold the small model's columns exactly only with contiguous
    # heads of the small head_dim (a doubled head interleaves them with zero columns).
    same_draft = contiguous and not doubled
    r = h / H
    norm_scale = math.sqrt(r)

    if os.path.isdir(args.out) and os.listdir(args.out) and not args.force:
        fail(f"{args.out} exists and is not empty (--force to overwrite)")
    os.makedirs(args.out, exist_ok=True)

    src = Source(args.src)
    zeros = ZeroChunks()
    q_dim, kv_dim = NH * HD, NKV * HD
    # Small head dims [0, hd/2) and [hd/2, hd) (the two halves RoPE pairs) go to the first
    # quarter and the third quarter of a doubled head: pairs (d, d + hd/2) -> (d, d + HD/2).
    halves = [(0, 0, hd // 2), (hd // 2, HD // 2, hd // 2)] if doubled else [(0, 0, hd)]

    def head_rows(src, dst_head, src_head, cols):
        return [(src, dst_head * HD + dd, 0, src_head * hd + sd, 0, n, cols)
                for sd, dd, n in halves]

    def head_cols(src, dst_head, src_head, rows):
        return [(src, 0, dst_head * HD + dd, 0, src_head * hd + sd, rows, n)
                for sd, dd, n in halves]

    def dtype_of(name):
        return src.tensors[name][1] if src.has(name) else "BF16"

    def norm(name):
        w = np.ones(H, dtype=np.float32)
        if name is not None:
            w[:h] = (src.f32(name, (h,)).astype(np.float64) * norm_scale).astype(np.float32)
        return Vector(w)

    def top_left(name, shape, big_shape):
        dt, a = src.raw(name, shape)
        return Placed(dt, big_shape, [(a, 0, 0, 0, 0, shape[0], shape[1])])

    def layer(i):
        p = f"model.layers.{i}."
        if i >= l:  # identity layer: all zero, norms 1
            dt = dtype_of("model.layers.0.self_attn.q_proj.weight")
            z = lambda *s: Placed(dt, s)  # noqa: E731
            return [(p + "input_layernorm.weight", norm(None)),
                    (p + "self_attn.q_proj.weight", z(q_dim, H)),
                    (p + "self_attn.k_proj.weight", z(kv_dim, H)),
                    (p + "self_attn.v_proj.weight", z(kv_dim, H)),
                    (p + "self_attn.o_proj.weight", z(H, q_dim)),
                    (p + "post_attention_layernorm.weight", norm(None)),
                    (p + "mlp.gate_proj.weight", z(I, H)),
                    (p + "mlp.up_proj.weight", z(I, H)),
                    (p + "mlp.down_proj.weight", z(H, I))]
        dq, wq = src.raw(p + "self_attn.q_proj.weight", (nh * hd, h))
        q = Placed(dq, (q_dim, H), [b for k in range(nh) for b in head_rows(wq, P[k], k, h)])
        kv = []
        for proj in ("k_proj", "v_proj"):
            dk, wk = src.raw(p + f"self_attn.{proj}.weight", (nkv * hd, h))
            kv.append(Placed(dk, (kv_dim, H), [b for j, s in enumerate(kv_src) if s is not None
                                               for b in head_rows(wk, j, s, h)]))
        do, wo = src.raw(p + "self_attn.o_proj.weight", (h, nh * hd))
        o = Placed(do, (H, q_dim), [b for k in range(nh) for b in head_cols(wo, P[k], k, h)])
        mlp = {"gate_proj": ((i_s, h), (I, H)), "up_proj": ((i_s, h), (I, H)),
               "down_proj": ((h, i_s), (H, I))}
        return ([(p + "input_layernorm.weight", norm(p + "input_layernorm.weight")),
                 (p + "self_attn.q_proj.weight", q),
                 (p + "self_attn.k_proj.weight", kv[0]),
                 (p + "self_attn.v_proj.weight", kv[1]),
                 (p + "self_attn.o_proj.weight", o),
                 (p + "post_attention_layernorm.weight",
                  norm(p + "post_attention_layernorm.weight"))]
                + [(p + f"mlp.{k}.weight", top_left(p + f"mlp.{k}.weight", *shapes))
                   for k, shapes in mlp.items()])

    def shards():
        yield [("model.embed_tokens.weight", top_left("model.embed_tokens.weight", (v, h), (V, H)))]
        for i in range(L):
            yield layer(i)
        last = [("model.norm.weight", norm("model.norm.weight"))]
        if not tied:
            last.append(("lm_head.weight", top_left("lm_head.weight", (v, h), (V, H))))
        yield last

    # Bytes to write, checked against the free space before anything is written.
    emb_b = V * H * ITEMSIZE[dtype_of("model.embed_tokens.weight")]
    mat_b = ITEMSIZE[dtype_of("model.layers.0.self_attn.q_proj.weight")]
    total = emb_b * (1 if tied else 2) + L * (mat_b * (2 * q_dim * H + 2 * kv_dim * H + 3 * H * I)
                                             + 8 * H) + 4 * H
    free = shutil.disk_usage(args.out).free
    if total > free:
        fail(f"{args.out}: needs {total / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")

    n_shards = L + 2
    weight_map, written = {}, 0
    for s, tensors in enumerate(shards()):
        fn = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        written += write_safetensors(os.path.join(args.out, fn), tensors, zeros)
        for name, _ in tensors:
            weight_map[name] = fn
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": written}, "weight_map": weight_map}, f, indent=1)

    cfg = dict(scfg)
    cfg.update({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
        "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV,
        "head_dim": HD, "intermediate_size": I, "vocab_size": V, "rms_norm_eps": eps * r,
        "max_position_embeddings": max(int(scfg.get("max_position_embeddings", 0)),
                                       MIN_MAX_POSITION),
        "torch_dtype": "bfloat16", "tie_word_embeddings": tied,
    })
    if "dtype" in cfg:
        cfg["dtype"] = "bfloat16"
    rp = scfg.get("rope_parameters")
    if isinstance(rp, dict) and "rope_theta" in rp and "rope_theta" not in cfg:
        cfg["rope_theta"] = rp["rope_theta"]  # for transformers v4, which reads it at the top
    if doubled:
        # Pair d of HD dims turns at theta'^(-2d/HD) = theta^(-2d/hd) with theta' = theta^2; the
        # softmax scale 1/sqrt(HD) becomes the small model's 1/sqrt(hd) through yarn's
        # attention_factor (cos and sin times 2^(1/4): scores times sqrt(2)); factor 1 leaves
        # the frequencies alone.
        theta = float(cfg.get("rope_theta") or 10000.0)
        cfg["rope_theta"] = theta * theta
        cfg["rope_parameters"] = {
            "rope_type": "yarn", "rope_theta": theta * theta, "factor": 1.0,
            "original_max_position_embeddings": cfg["max_position_embeddings"],
            "attention_factor": math.sqrt(math.sqrt(HD / hd))}
        cfg.pop("rope_scaling", None)
    for fn in COPY_FILES:
        if os.path.exists(os.path.join(args.src, fn)):
            shutil.copy(os.path.join(args.src, fn), os.path.join(args.out, fn))
    info = {
        "source": os.path.realpath(args.src), "shape": args.shape,
        "large": {"hidden": H, "layers": L, "heads": NH, "kv_heads": NKV, "inter": I, "vocab": V},
        "small": {"hidden": h, "layers": l, "heads": nh, "kv_heads": nkv, "inter": i_s,
                  "vocab": v},
        "head_dim": HD, "small_head_dim": hd, "r": r, "norm_weight_scale": norm_scale,
        "rms_norm_eps": eps * r,
        "q_head_of_small_q_head": P, "small_kv_head_of_kv_head": kv_src,
        "contiguous_heads": contiguous, "same_draft_quantization": same_draft, "bytes": written,
    }
    with open(os.path.join(args.out, "padding.json"), "w") as f:
        json.dump(info, f, indent=1)
    # config.json last: its presence marks a complete model (tools/gpu/bench_e2e.sh).
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(f"wrote {args.out}: {args.shape} (hidden {H}, {L} layers, {NH}/{NKV} heads of {HD}, "
          f"inter {I}, "
          f"vocab {V}) from {args.src}; {written / 2**30:.2f} GiB; q heads {P} "
          f"({'contiguous' if contiguous else 'not contiguous'}; 4-bit o_proj groups "
          f"{'as in the small model' if same_draft else 'differ from the small model'})")


if __name__ == "__main__":
    main()
