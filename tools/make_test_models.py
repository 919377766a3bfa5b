#!/usr/bin/env python3
"""Build the tiny random-weight test models and their Hugging Face transformers goldens.

Run on a machine with torch + transformers, GPU or CPU (each golden's summary.json names the versions and the device). Seeded and
deterministic. For each model in MODELS it:
  1. writes config.json the way real Hub models spell it (legacy `rope_scaling` for some, the
     transformers-v5 layout for others, so the loader is tested on both),
  2. builds the model with random weights (norm weights and biases randomized too, so that no
     parameter is trivially 1 or 0), saves it as safetensors in the stated dtype (sharded for one),
  3. copies the tokenizer files it uses (models/tokenizers/<kind>),
  4. reloads the saved directory with AutoModelForCausalLM in float32 (so the goldens are HF's
     reading of exactly the files we ship) and stores, under tests/data/golden/<name>/:
       ids_40.npy / ids_300.npy        int32 token ids (seeded random)
       logits_40.npy / logits_300.npy  float32 [n, vocab] logits at every position of one forward
                                       (logits_300: the first GOLDEN_300_VOCAB columns)
       greedy.json                     64-token greedy continuation of ids_40 (no EOS stop)
Usage: python3 tools/make_test_models.py --out-models models/test --out-goldens tests/data/golden
"""
import argparse
import json
import os
import shutil

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 1234
GREEDY_TOKENS = 64
GOLDEN_300_VOCAB = 512  # columns kept of the 300-token logits golden


def llama3_config(vocab, bos, eos):
    # Llama-3.x style: GQA, explicit head_dim != hidden/heads, llama3 rope scaling whose
    # original_max_position_embeddings (32) is far below the 300-token golden sequence.
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab, "hidden_size": 128, "intermediate_size": 384,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
        "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
        "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "bfloat16",
        "initializer_range": 0.08,
    }


def llama2_config(vocab, bos, eos):
    # Llama-2 style: MHA, linear rope scaling (as Llama-2-7B-32K), fp16 weights; attention_bias
    # (q/k/v/o biases, as some Llama fine-tunes have) so that path is checked against HF too.
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab, "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "rope_scaling": {"type": "linear", "factor": 4.0}, "attention_bias": True,
        "tie_word_embeddings": False, "hidden_act": "silu",
        "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "float16",
        "initializer_range": 0.08,
    }


def mistral_config(vocab, bos, eos):
    return {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral",
        "vocab_size": vocab, "hidden_size": 128, "intermediate_size": 320,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 1,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
        "sliding_window": None, "tie_word_embeddings": False, "hidden_act": "silu",
        "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "float32",
        "initializer_range": 0.08,
    }


def qwen2_config(vocab, bos, eos):
    # Qwen2: q/k/v bias, tied embeddings, sharded checkpoint.
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": vocab, "hidden_size": 128, "intermediate_size": 352,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 2,
        "tie_word_embeddings": True, "hidden_act": "silu",
        "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "float32",
        "initializer_range": 0.08,
    }


def qwen2_yarn_config(vocab, bos, eos):
    # Qwen2.5's long-context spelling: legacy `rope_scaling` with type yarn (factor 4 over an
    # original 1024 positions; max_position_embeddings / original = factor, so every reading of
    # the factor agrees). YaRN changes every frequency and the attention scale, so short goldens
    # test it.
    cfg = qwen2_config(vocab, bos, eos)
    cfg.update({"rope_theta": 10000.0,  # wavelengths on both sides of YaRN's ramp
                "rope_scaling": {"type": "yarn", "factor": 4.0,
                                 "original_max_position_embeddings": 1024}})
    return cfg


# name, config builder, tokenizer kind, save dtype, shard size, keep the hand-written config.json
MODELS = [
    ("llama3-tiny", llama3_config, "bytelevel", torch.bfloat16, None, True),
    ("llama2-tiny", llama2_config, "spm", torch.float16, None, True),
    ("mistral-tiny", mistral_config, "spm", torch.float32, None, False),
    ("qwen2-tiny", qwen2_config, "bytelevel", torch.float32, "300KB", False),
    ("qwen2-yarn-tiny", qwen2_yarn_config, "bytelevel", torch.float32, None, True),
]


def tokenizer_ids(tok_dir):
    with open(os.path.join(tok_dir, "tokenizer.json")) as f:
        tj = json.load(f)
    vocab = len(tj["model"]["vocab"])
    ids = {t["content"]: t["id"] for t in tj.get("added_tokens", [])}
    vocab = max([vocab] + [i + 1 for i in ids.values()])
    with open(os.path.join(tok_dir, "tokenizer_config.json")) as f:
        tc = json.load(f)

    def tok_id(v):
        if v is None:
            return None
        s = v["content"] if isinstance(v, dict) else v
        return ids.get(s, tj["model"]["vocab"].get(s))

    return vocab, tok_id(tc.get("bos_token")), tok_id(tc.get("eos_token"))


def randomize_extra(model, gen):
    """Norm weights ~ 1 + 0.2 N(0,1) and biases ~ 0.1 N(0,1), so they are really tested."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def build(name, make_cfg, tok_kind, dtype, shard, keep_cfg, out_models, out_goldens):
    tok_dir = os.path.join(REPO, "models", "tokenizers", tok_kind)
    vocab, bos, eos = tokenizer_ids(tok_dir)
    cfg_dict = make_cfg(vocab, bos, eos)
    mdir = os.path.join(out_models, name)
    shutil.rmtree(mdir, ignore_errors=True)
    os.makedirs(mdir)
    with open(os.path.join(mdir, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2)
    config = transformers.AutoConfig.from_pretrained(mdir)

    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize_extra(model, gen)
    model = model.to(dtype)
    kwargs = {"safe_serialization": True}
    if shard:
        kwargs["max_shard_size"] = shard
    model.save_pretrained(mdir, **kwargs)
    if keep_cfg:  # save_pretrained rewrote it in its own layout: ship the Hub-style one
        with open(os.path.join(mdir, "config.json"), "w") as f:
            json.dump(cfg_dict, f, indent=2)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, fn), os.path.join(mdir, fn))

    # Goldens from a fresh load of what we ship, in float32.
    ref = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32).eval()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ref = ref.to(dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gdir = os.path.join(out_goldens, name)
    shutil.rmtree(gdir, ignore_errors=True)
    os.makedirs(gdir)
    rng = np.random.default_rng(SEED)
    summary = {"model": name, "transformers": transformers.__version__, "torch": torch.__version__,
               "device": dev}
    for n in (40, 300):
        ids = rng.integers(0, vocab, size=n).astype(np.int32)
        if bos is not None:
            ids[0] = bos
        with torch.no_grad():
            logits = ref(torch.tensor(ids[None, :], dtype=torch.long, device=dev)).logits[0]
        np.save(os.path.join(gdir, f"ids_{n}.npy"), ids)
        # The 300-token logits keep the first GOLDEN_300_VOCAB columns (every logit depends on the
        # whole hidden state; the full [300, vocab] arrays made the device copy too large).
        cols = GOLDEN_300_VOCAB if n == 300 else logits.shape[1]
        np.save(os.path.join(gdir, f"logits_{n}.npy"), logits[:, :cols].float().cpu().numpy())
        summary[f"max_abs_logit_{n}"] = float(logits.abs().max())
        if n == 40:
            seq = torch.tensor(ids[None, :], dtype=torch.long, device=dev)
            out = []
            with torch.no_grad():
                for _ in range(GREEDY_TOKENS):  # full recompute: no cache subtleties
                    nxt = int(ref(seq).logits[0, -1].argmax())
                    out.append(nxt)
                    seq = torch.cat([seq, torch.tensor([[nxt]], device=dev)], dim=1)
            with open(os.path.join(gdir, "greedy.json"), "w") as f:
                json.dump({"prompt_ids": ids.tolist(), "greedy_ids": out}, f)
    with open(os.path.join(gdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-models", default=os.path.join(REPO, "models", "test"))
    ap.add_argument("--out-goldens", default=os.path.join(REPO, "tests", "data", "golden"))
    ap.add_argument("--only", nargs="*", help="model names to build (default: all)")
    args = ap.parse_args()
    for spec in MODELS:
        if args.only and spec[0] not in args.only:
            continue
        build(*spec, args.out_models, args.out_goldens)


if __name__ == "__main__":
    main()
