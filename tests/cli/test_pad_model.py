"""tools/pad_model.py: the padded model computes the small model's function (issue #6).

models/default is padded into small custom shapes (an MHA target, whose heads are placed
contiguously, and a GQA target, whose heads are not) and compared through the quantspec binary:
logits of the real vocab equal to 1e-5 of the largest |logit|, logits of the extra vocab exactly
0, greedy generations identical (AR and QuantSpec), and for the MHA target (the 4-bit draft
quantizes identically) the same acceptance.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO

TOOL = os.path.join(REPO, "tools", "pad_model.py")
SMALL = os.path.join(REPO, "models", "default")
HELDOUT = os.path.join(SMALL, "heldout.u16")
SHAPES = {  # name: --heads, --kv-heads, --head-dim (hidden 512, 8 layers, inter 2048, vocab 9000)
    "mha": (16, 16, None),
    "gqa": (16, 4, None),
    "mha128": (8, 8, 128),  # doubled heads: theta^2, yarn attention_factor 2^(1/4)
    "gqa128": (8, 2, 128),
}


def pad(out, heads, kv_heads, head_dim=None, hidden=512, layers=8, inter=2048, vocab=9000,
        check=True):
    extra = ["--head-dim", str(head_dim)] if head_dim else []
    p = subprocess.run([sys.executable, TOOL, "--src", SMALL, "--out", str(out),
                        "--shape", "custom", "--hidden", str(hidden), "--layers", str(layers),
                        "--heads", str(heads), "--kv-heads", str(kv_heads), "--inter", str(inter),
                        "--vocab", str(vocab)] + extra,
                       capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    base = tmp_path_factory.mktemp("padded")
    dirs = {}
    for name, (heads, kv_heads, head_dim) in SHAPES.items():
        dirs[name] = base / name
        pad(dirs[name], heads, kv_heads, head_dim)
    return dirs


@pytest.fixture(scope="module")
def prompt_file(qs, tmp_path_factory):
    """About 490 tokens of held-out text (> 2G = 256: the quantized KV planes are read; 48 more
    cross a group boundary: a flush). A passage where the 4-bit draft is often rejected (greedy
    acceptance 0.60), so equal acceptance means something."""
    ids = np.fromfile(HELDOUT, dtype=np.uint16)[50000:50490].tolist()
    text = json.loads(qs("detokenize", "-m", SMALL, input=json.dumps({"ids": ids}) + "\n")
                      .stdout)["text"]
    path = tmp_path_factory.mktemp("prompt") / "prompt.txt"
    path.write_text(text)
    return path


def test_layout(padded):
    mha = json.loads((padded["mha"] / "padding.json").read_text())
    gqa = json.loads((padded["gqa"] / "padding.json").read_text())
    assert mha["contiguous_heads"] and mha["q_head_of_small_q_head"] == [0, 1, 2, 3, 4, 5]
    assert not gqa["contiguous_heads"] and gqa["q_head_of_small_q_head"] == [0, 1, 2, 4, 5, 6]
    assert gqa["small_kv_head_of_kv_head"] == [0, 1, None, None]
    cfg = json.loads((padded["gqa"] / "config.json").read_text())
    small = json.loads(open(os.path.join(SMALL, "config.json")).read())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["head_dim"], cfg["vocab_size"]) == (512, 8, 16, 4, 64,
                                                                                 9000)
    assert cfg["max_position_embeddings"] >= 131072
    assert cfg["rms_norm_eps"] == pytest.approx(small["rms_norm_eps"] * 384 / 512)
    assert cfg.get("rope_parameters") == small.get("rope_parameters")
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        assert (padded["gqa"] / fn).read_bytes() == open(os.path.join(SMALL, fn), "rb").read()


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_logits_equal(qs, padded, tmp_path, name):
    ids = np.fromfile(HELDOUT, dtype=np.uint16)[:300].astype(np.int64)
    tokens = tmp_path / "ids.u16"
    ids.astype("<u2").tofile(tokens)
    out_small, out_big = tmp_path / "small.npy", tmp_path / "big.npy"
    qs("logits", "-m", SMALL, "--tokens", tokens, "--token-dtype", "u16", "--out", out_small)
    qs("logits", "-m", padded[name], "--tokens", tokens, "--token-dtype", "u16", "--out", out_big)
    a, b = np.load(out_small), np.load(out_big)
    assert a.shape == (300, 8192) and b.shape == (300, 9000)
    scale = np.abs(a).max()
    err = np.abs(b[:, :8192] - a).max() / scale
    assert err <= 1e-5, f"{name}: max |diff| / max |logit| = {err:.3g}"
    assert np.all(b[:, 8192:] == 0.0), "extra vocab logits must be exactly 0"
    # Greedy over the padded vocab differs from the small model's only where the top real logit
    # is <= 0 (then an extra id with logit 0 wins).
    nonpos = a.max(axis=1) <= 0
    same = b.argmax(axis=1) == a.argmax(axis=1)
    print(f"\n{name}: max rel. logit error {err:.2e}; top real logit <= 0 at "
          f"{int(nonpos.sum())} of {len(a)} positions")
    assert np.array_equal(same | nonpos, np.ones(len(a), bool))


def generate(qs, model, prompt, stats, *extra):
    qs("generate", "-m", model, "-f", prompt, "-n", "48", "--ignore-eos", "--stats-json", stats,
       *extra)
    return json.loads(stats.read_text())


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_greedy_generation_equal(qs, padded, prompt_file, tmp_path, name):
    for mode in (("--mode", "ar"), ("--mode", "ar", "--kv", "int8"), ("--mode", "quantspec")):
        s = generate(qs, SMALL, prompt_file, tmp_path / "small.json", *mode)
        b = generate(qs, padded[name], prompt_file, tmp_path / "big.json", *mode)
        assert s["prompt_tokens"] == b["prompt_tokens"] > 256
        assert b["generated_tokens"] == 48
        assert b["tokens"] == s["tokens"], f"{name} {' '.join(mode)}"
        if mode[-1] == "quantspec":
            print(f"\n{name}: acceptance small {s['acceptance_rate']:.4f} padded "
                  f"{b['acceptance_rate']:.4f}; mean accepted length small "
                  f"{s['mean_accepted_length']:.3f} padded {b['mean_accepted_length']:.3f}")
            assert b["flushes"] >= 1
            if name == "mha":  # the draft quantizes identically: the same rounds
                for key in ("acceptance_rate", "accepted_histogram", "rounds", "drafted"):
                    assert b[key] == s[key], key


def test_errors(tmp_path):
    p = pad(tmp_path / "a", 4, 4, check=False)  # fewer q heads than the small model's 6
    assert p.returncode != 0 and "heads" in p.stderr
    p = pad(tmp_path / "b", 8, 1, check=False)  # one kv head cannot serve two small kv heads
    assert p.returncode != 0 and "kv heads" in p.stderr
    p = pad(tmp_path / "c", 16, 16, hidden=256, check=False)
    assert p.returncode != 0 and "hidden" in p.stderr
    assert not os.path.exists(tmp_path / "c" / "config.json")
    p = pad(tmp_path / "d", 16, 16, head_dim=96, check=False)  # neither 64 nor 128
    assert p.returncode != 0 and "--head-dim" in p.stderr


def test_doubled_heads_layout(padded):
    cfg = json.loads((padded["gqa128"] / "config.json").read_text())
    small = json.loads(open(os.path.join(SMALL, "config.json")).read())
    theta = small["rope_parameters"]["rope_theta"]
    assert cfg["head_dim"] == 128 and cfg["rope_theta"] == theta * theta
    rp = cfg["rope_parameters"]
    assert rp["rope_type"] == "yarn" and rp["factor"] == 1.0
    assert rp["attention_factor"] == pytest.approx(2 ** 0.25)
    info = json.loads((padded["gqa128"] / "padding.json").read_text())
    assert info["small_head_dim"] == 64 and not info["same_draft_quantization"]
    assert json.loads((padded["mha"] / "padding.json").read_text())["same_draft_quantization"]
