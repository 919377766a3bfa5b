#!/usr/bin/env python3
"""Write a seeded random-weight Llama-family model directory of a named or custom shape.

For benchmarks (speed and memory at real shapes); the values are random, so the text is noise.
Needs only numpy (bf16 is written by hand), so it runs here, on CI and on the GPU machine.
Weights are N(0, 0.02) (norms 1), written shard by shard so memory stays bounded.

  python3 tools/make_synthetic_model.py --shape llama2-7b --out /tmp/llama2-7b
  python3 tools/make_synthetic_model.py --shape custom --hidden 2048 --layers 8 --heads 16 \
      --kv-heads 4 --inter 5632 --vocab 32000 --out /tmp/m
The tokenizer of models/tokenizers/bytelevel is copied in (its ids are a subset of any vocab
>= 2048), so `quantspec generate` works on the result.
"""
import argparse
import json
import os
import shutil
import struct

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SHAPES = {
    # name: hidden, layers, heads, kv_heads, inter, vocab, rope_theta, max_pos, extra config
    "llama2-7b": (4096, 32, 32, 32, 11008, 32000, 10000.0, 4096, {}),
    "llama3.1-8b": (4096, 32, 32, 8, 14336, 128256, 500000.0, 131072, {
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}),
    "llama-0.5b": (1536, 16, 12, 4, 4096, 32000, 500000.0, 32768, {}),
}


def to_bf16_bytes(a):
    """float32 array -> bf16 bytes, round to nearest even."""
    u = a.astype(np.float32).view(np.uint32)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16).tobytes()


def write_safetensors(path, tensors):
    """tensors: list of (name, shape, bytes) in bf16."""
    header, offset = {}, 0
    for name, shape, data in tensors:
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, data in tensors:
            f.write(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama-0.5b", choices=sorted(SHAPES) + ["custom"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--inter", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torch-device", default="",
                    help="draw the values with torch on this device (e.g. cuda: seconds instead "
                         "of minutes for 7B shapes; different values than numpy's)")
    args = ap.parse_args()

    if args.shape == "custom":
        hidden, layers, heads, kv_heads, inter, vocab = (args.hidden, args.layers, args.heads,
                                                         args.kv_heads, args.inter, args.vocab)
        theta, max_pos, extra = 500000.0, 32768, {}
    else:
        hidden, layers, heads, kv_heads, inter, vocab, theta, max_pos, extra = SHAPES[args.shape]
    head_dim = hidden // heads
    rng = np.random.default_rng(args.seed)
    os.makedirs(args.out, exist_ok=True)

    def rand(*shape):
        return to_bf16_bytes(rng.standard_normal(shape, dtype=np.float32) * 0.02)

    if args.torch_device:
        import torch
        gen = torch.Generator(device=args.torch_device).manual_seed(args.seed)

        def rand(*shape):  # noqa: F811 (the fast path)
            t = torch.randn(shape, generator=gen, device=args.torch_device,
                            dtype=torch.float32).mul_(0.02).to(torch.bfloat16)
            return t.view(torch.int16).cpu().numpy().tobytes()

    def ones(n):
        return to_bf16_bytes(np.ones(n, dtype=np.float32))

    # Shards are produced one at a time and written at once, so memory stays one shard.
    def shards():
        yield [("model.embed_tokens.weight", (vocab, hidden), rand(vocab, hidden))]
        for i in range(layers):
            yield layer(i)
        yield [("model.norm.weight", (hidden,), ones(hidden)),
               ("lm_head.weight", (vocab, hidden), rand(vocab, hidden))]

    def layer(i):
        p = f"model.layers.{i}."
        return [
            (p + "input_layernorm.weight", (hidden,), ones(hidden)),
            (p + "self_attn.q_proj.weight", (heads * head_dim, hidden), rand(heads * head_dim, hidden)),
            (p + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden), rand(kv_heads * head_dim, hidden)),
            (p + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden), rand(kv_heads * head_dim, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, heads * head_dim), rand(hidden, heads * head_dim)),
            (p + "post_attention_layernorm.weight", (hidden,), ones(hidden)),
            (p + "mlp.gate_proj.weight", (inter, hidden), rand(inter, hidden)),
            (p + "mlp.up_proj.weight", (inter, hidden), rand(inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter), rand(hidden, inter)),
        ]

    weight_map = {}
    n_shards = layers + 2
    for s, tensors in enumerate(shards()):
        fn = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        write_safetensors(os.path.join(args.out, fn), tensors)
        for name, _, _ in tensors:
            weight_map[name] = fn
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
           "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
           "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
           "max_position_embeddings": max_pos, "rms_norm_eps": 1e-5, "rope_theta": theta,
           "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
           "bos_token_id": 2041, "eos_token_id": 2042, **extra}
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    tok = os.path.join(REPO, "models", "tokenizers", "bytelevel")
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok, fn), os.path.join(args.out, fn))
    n_params = vocab * hidden * 2 + layers * (hidden * head_dim * (2 * heads + 2 * kv_heads)
                                              + 3 * hidden * inter + 2 * hidden) + hidden
    print(f"wrote {args.out}: {args.shape}, {n_params / 1e9:.3f} B params, "
          f"{2 * n_params / 2**30:.2f} GiB bf16")


if __name__ == "__main__":
    main()
