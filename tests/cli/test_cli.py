"""End-to-end tests of the quantspec binary: contracts, HF goldens, bad input."""
import json

import numpy as np
import pytest

from conftest import REPO, TEST_MODELS, golden_dir, model_dir

SUBCOMMANDS = ["generate", "tokenize", "detokenize", "logits"]


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_help(qs, sub):
    p = qs(sub, "--help")
    assert "Usage" in p.stdout or "usage" in p.stdout.lower()


def test_bad_flag_is_a_usage_error(qs):
    p = qs("generate", "--no-such-flag", "-p", "x", check=False)
    assert p.returncode == 2
    assert "no-such-flag" in p.stderr


def test_missing_subcommand(qs):
    assert qs(check=False).returncode == 2


@pytest.mark.parametrize("name", TEST_MODELS)
def test_logits_match_hf(qs, tmp_path, name):
    ids = np.load(f"{golden_dir(name)}/ids_40.npy")
    ref = np.load(f"{golden_dir(name)}/logits_40.npy")
    out = tmp_path / "l.npy"
    qs("logits", "-m", model_dir(name), "--ids", ",".join(map(str, ids)), "--out", out)
    got = np.load(out)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


@pytest.mark.parametrize("name", TEST_MODELS)
def test_generate_stats_json(qs, tmp_path, name):
    stats = tmp_path / "s.json"
    p = qs("generate", "-m", model_dir(name), "-p", "Hello world", "-n", "12", "--ignore-eos",
           "--stats-json", stats)
    s = json.loads(stats.read_text())
    for key in ("prompt_tokens", "generated_tokens", "prefill_s", "decode_s", "decode_tok_s"):
        assert key in s
    assert s["generated_tokens"] == 12
    assert s["prompt_tokens"] >= 2
    assert "quantspec generate" in p.stderr  # the resolved configuration, printed once
    assert p.stderr.count("quantspec generate") == 1


def test_seed_determinism(qs):
    args = ["generate", "-m", model_dir("llama3-tiny"), "-p", "Once upon", "-n", "16",
            "--temperature", "0.9", "--top-p", "0.95", "--ignore-eos"]
    a = qs(*args, "--seed", "7").stdout
    b = qs(*args, "--seed", "7").stdout
    c = qs(*args, "--seed", "8").stdout
    assert a == b
    assert a != c


def test_tokenize_detokenize_roundtrip_on_tokenizer_only_dir(qs):
    tok_dir = f"{REPO}/models/tokenizers/bytelevel"
    texts = ["Hello, world!", "  spaces\tand\ttabs\n", "naïve café 日本語 🙂"]
    inp = "\n".join(json.dumps({"text": t}) for t in texts) + "\n"
    out = qs("tokenize", "-m", tok_dir, input=inp).stdout.strip().split("\n")
    ids = [json.loads(line)["ids"] for line in out]
    assert len(ids) == 3 and all(ids)
    back = qs("detokenize", "-m", tok_dir,
              input="\n".join(json.dumps({"ids": i}) for i in ids) + "\n").stdout
    assert [json.loads(line)["text"] for line in back.strip().split("\n")] == texts


def test_tokenize_add_special(qs):
    tok_dir = f"{REPO}/models/tokenizers/spm"
    plain = json.loads(qs("tokenize", "-m", tok_dir, input='{"text": "hi"}\n').stdout)["ids"]
    special = json.loads(qs("tokenize", "-m", tok_dir, "--add-special",
                            input='{"text": "hi"}\n').stdout)["ids"]
    assert special[1:] == plain and len(special) == len(plain) + 1


def test_tokenize_bad_line(qs):
    p = qs("tokenize", "-m", model_dir("llama3-tiny"), input='{"txt": 1}\n', check=False)
    assert p.returncode == 1 and "line 1" in p.stderr


# ---- bad input: a clear one-line error, non-zero exit, no crash ----

def assert_clean_error(p, *needles):
    assert p.returncode == 1, p.stderr
    assert "quantspec: error:" in p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr


def test_missing_model_dir(qs, tmp_path):
    p = qs("generate", "-m", tmp_path / "nope", "-p", "x", check=False)
    assert_clean_error(p, "nope")


def test_unknown_architecture(qs, model_copy):
    d = model_copy("llama3-tiny")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    cfg["model_type"] = "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    assert_clean_error(qs("generate", "-m", d, "-p", "x", check=False), "GPT2LMHeadModel")


def test_truncated_safetensors(qs, model_copy):
    d = model_copy("llama3-tiny")
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    assert_clean_error(qs("generate", "-m", d, "-p", "x", check=False), "model.safetensors")


def test_missing_shard(qs, model_copy):
    d = model_copy("qwen2-tiny")
    shards = sorted(d.glob("model-*.safetensors"))
    assert shards, "qwen2-tiny is sharded"
    shards[-1].unlink()
    assert_clean_error(qs("generate", "-m", d, "-p", "x", check=False), shards[-1].name)


def test_wrong_shape(qs, model_copy):
    d = model_copy("llama3-tiny")
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] += 8
    (d / "config.json").write_text(json.dumps(cfg))
    assert_clean_error(qs("generate", "-m", d, "-p", "x", check=False), "mlp")


def test_prompt_longer_than_context(qs):
    p = qs("generate", "-m", model_dir("llama3-tiny"), "--ctx", "16", "-p", "word " * 100,
           check=False)
    assert_clean_error(p, "context")


def test_bad_sampling_values(qs):
    for flag, val in (("--temperature", "-1"), ("--temperature", "nan"), ("--top-p", "0"),
                      ("--top-p", "1.5"), ("--min-p", "2")):
        p = qs("generate", "-m", model_dir("llama3-tiny"), "-p", "x", flag, val, check=False)
        assert p.returncode in (1, 2), (flag, val, p.stderr)
        assert "error" in p.stderr.lower() or "Error" in p.stderr


def test_logits_bad_ids(qs, tmp_path):
    p = qs("logits", "-m", model_dir("llama3-tiny"), "--ids", "1,x,3", "--out",
           tmp_path / "o.npy", check=False)
    assert_clean_error(p, "'x'")
    p = qs("logits", "-m", model_dir("llama3-tiny"), "--ids", "99999999", "--out",
           tmp_path / "o.npy", check=False)
    assert_clean_error(p, "vocabulary")
