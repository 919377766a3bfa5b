"""End-to-end tests of the quantspec binary: contracts, HF goldens, bad input."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO, TEST_MODELS, golden_dir, model_dir

SUBCOMMANDS = ["generate", "chat", "tokenize", "detokenize", "logits", "eval", "bench"]


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


def test_generate_tensor_parallel(qs, tmp_path):
    # llama3-tiny: 4 attention heads, 2 kv heads, intermediate 384: shards over 2, not over 3.
    cfg = json.loads(open(os.path.join(model_dir("llama3-tiny"), "config.json")).read())
    assert cfg["num_attention_heads"] % 2 == 0 and cfg["num_key_value_heads"] % 2 == 0
    for mode in ("ar", "quantspec"):
        args = ["generate", "-m", model_dir("llama3-tiny"), "-p", "Once upon a time", "-n", "24",
                "--ignore-eos", "--mode", mode, "--group-size", "32"]
        one = qs(*args, "--tp", "1")
        stats = tmp_path / f"{mode}.json"
        two = qs(*args, "--tp", "2", "--stats-json", stats)
        assert two.stdout == one.stdout, mode
        assert "tensor parallel 2" in two.stderr
        assert json.loads(stats.read_text())["tensor_parallel"] == 2
    p = qs("generate", "-m", model_dir("llama3-tiny"), "-p", "hi", "-n", "4", "--tp", "3",
           check=False)
    assert_clean_error(p, "--tp 3 (tensor parallel): num_attention_heads (4) is not a "
                          "multiple of the world size (3)")


def test_kv_dtype(qs, tmp_path, monkeypatch):
    """--kv-dtype: the full-precision KV rows, shown in the configuration and the stats."""
    args = ["generate", "-m", model_dir("llama3-tiny"), "-p", "Once upon a time", "-n", "20",
            "--ignore-eos", "--group-size", "32"]
    stats = tmp_path / "auto.json"
    p = qs(*args, "--stats-json", stats)
    assert "kv dtype f32 (auto)" in p.stderr and "KV full precision (f32 rows)" in p.stderr
    assert json.loads(stats.read_text())["kv_buffer"] == "f32"
    for extra in ([], ["--kv", "int8"], ["--mode", "quantspec"], ["--mode", "snapkv"]):
        stats = tmp_path / "f16.json"
        p = qs(*args, *extra, "--kv-dtype", "f16", "--stats-json", stats)
        assert "kv dtype f16," in p.stderr, p.stderr
        assert json.loads(stats.read_text())["kv_buffer"] == "f16"
        assert json.loads(stats.read_text())["generated_tokens"] == 20
    p = qs(*args, "--mode", "quantspec", "--kv-dtype", "F16")  # case-insensitive
    assert "f16 buffer" in p.stderr
    monkeypatch.setenv("QS_KV_DTYPE", "f16")
    p = qs(*args)
    assert "kv dtype f16," in p.stderr
    monkeypatch.delenv("QS_KV_DTYPE")
    # The logits of f16 rows stay close to HF's f32 ones (rounding of K and V only).
    ids = np.load(f"{golden_dir('llama3-tiny')}/ids_40.npy")
    ref = np.load(f"{golden_dir('llama3-tiny')}/logits_40.npy")
    out = tmp_path / "l.npy"
    qs("logits", "-m", model_dir("llama3-tiny"), "--ids", ",".join(map(str, ids)), "--out", out,
       "--kv-dtype", "f16")
    err = np.abs(np.load(out) - ref).max() / np.abs(ref).max()
    assert 0 < err <= 1e-2
    bad = qs(*args, "--kv-dtype", "bf16", check=False)
    assert bad.returncode == 2
    assert "--kv-dtype" in bad.stderr and "'bf16' is not one of auto|f16|f32" in bad.stderr


def test_prefill_matmul(qs, tmp_path):
    """--prefill-matmul: a GPU choice (exact | bf16); the CPU computes in f32 either way."""
    args = ["generate", "-m", model_dir("llama3-tiny"), "-p", "Once upon a time", "-n", "12",
            "--ignore-eos"]
    outs = {}
    for choice in ("exact", "bf16"):
        stats = tmp_path / f"{choice}.json"
        qs(*args, "--prefill-matmul", choice, "--stats-json", stats)
        j = json.loads(stats.read_text())
        assert j["prefill_matmul"] == "f32"  # on the CPU
        outs[choice] = j["tokens"]
    assert outs["exact"] == outs["bf16"]
    bad = qs(*args, "--prefill-matmul", "fp8", check=False)
    assert bad.returncode == 2
    assert "--prefill-matmul" in bad.stderr and "'fp8' is not one of bf16|exact" in bad.stderr


@pytest.mark.parametrize("flag,key", [("--draft-attention", "draft_attention"),
                                      ("--target-attention", "target_attention")])
def test_attention_operands(qs, tmp_path, flag, key):
    """--draft-attention / --target-attention: GPU choices (f16 | exact) for the attention over
    the INT4 (draft) and INT8 (target) KV views; the CPU is exact either way, so the tokens and
    the acceptance are the same; a bad value is a usage error."""
    args = ["generate", "-m", model_dir("llama3-tiny"), "-p", "Once upon a time " * 10, "-n", "16",
            "--ignore-eos", "--mode", "quantspec"]
    runs = {}
    for choice in ("f16", "exact"):
        stats = tmp_path / f"{choice}.json"
        r = qs(*args, flag, choice, "--stats-json", stats)
        j = json.loads(stats.read_text())
        assert j[key] == "exact"  # on the CPU
        runs[choice] = (j["tokens"], j["accepted"])
    assert runs["f16"] == runs["exact"]
    bad = qs(*args, flag, "int8", check=False)
    assert bad.returncode == 2
    assert flag in bad.stderr and "'int8' is not one of exact|f16" in bad.stderr


def test_prefill_kv(qs, tmp_path):
    """--prefill-kv: quantized prefill in a quantized mode runs, is reported and shows up in the
    configuration line; a bad value is a usage error."""
    args = ["generate", "-m", model_dir("llama3-tiny"), "-p", "Once upon a time " * 20, "-n", "12",
            "--ignore-eos", "--mode", "quantspec", "--prefill-chunk", "16"]
    for choice in ("exact", "quantized"):
        stats = tmp_path / f"{choice}.json"
        run = qs(*args, "--prefill-kv", choice, "--stats-json", stats)
        j = json.loads(stats.read_text())
        assert j["prefill_kv"] == choice
        assert len(j["tokens"]) == 12
        assert f"prefill kv {choice}" in run.stderr
    bad = qs(*args, "--prefill-kv", "int8", check=False)
    assert bad.returncode == 2
    assert "--prefill-kv" in bad.stderr and "'int8' is not one of exact|quantized" in bad.stderr


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
    p = qs("tokenize", "-m", model_dir("llama3-tiny"), input='{"text": "\\ud800"}\n', check=False)
    assert p.returncode == 1 and "line 1: not valid JSON" in p.stderr and "surrogate" in p.stderr


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


def test_long_prompt_grows_the_default_context(qs, model_copy, tmp_path):
    """Without --ctx the cache is min(model max, 8192), grown for a longer prompt and -n up to
    max_position_embeddings: a 9K-token prompt needs no flag on a 12K model (as generate and
    logits), a prompt past the model's length names it, and an explicit --ctx is kept."""
    d = model_copy("llama3-tiny")
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = 12000
    (d / "config.json").write_text(json.dumps(cfg))
    prompt = "word " * 4600  # 9202 tokens with this tokenizer
    for mode in ("ar", "quantspec"):
        p = qs("generate", "-m", d, "-p", prompt, "-n", "4", "--mode", mode, "--stats-json",
               tmp_path / "s.json")
        assert "context 9206 tokens" in p.stderr
        stats = json.loads((tmp_path / "s.json").read_text())
        assert stats["prompt_tokens"] == 9202 and stats["generated_tokens"] == 4
        assert stats["max_context"] == 9206
    short = qs("generate", "-m", d, "-p", "word", "-n", "4")
    assert "context 8192 tokens" in short.stderr
    # -n past the model's length: the context stops there, and so does the generation.
    p = qs("generate", "-m", d, "-p", "word " * 5990, "-n", "100", "--ignore-eos", "--stats-json",
           tmp_path / "s.json")
    assert "context 12000 tokens" in p.stderr
    stats = json.loads((tmp_path / "s.json").read_text())
    # 18 tokens fill the cache; the 19th is sampled from the last position's logits.
    assert stats["prompt_tokens"] == 11982 and stats["generated_tokens"] == 19
    assert stats["finish_reason"] == "length"
    p = qs("generate", "-m", d, "-p", "word " * 6100, "-n", "4", check=False)
    assert_clean_error(p, "12202 tokens, more than the model's maximum context of 12000",
                       "max_position_embeddings", "--ctx")
    p = qs("generate", "-m", d, "-p", prompt, "-n", "4", "--ctx", "8192", check=False)
    assert_clean_error(p, "9202 tokens but the context is 8192", "--ctx")
    ids = ",".join(["5"] * 9000)
    p = qs("logits", "-m", d, "--ids", ids, "--last", "1", "--out", tmp_path / "l.npy")
    assert "context 9000 tokens" in p.stderr
    assert np.load(tmp_path / "l.npy").shape == (1, cfg["vocab_size"])


def test_generate_chat_renders_the_template(qs, tmp_path):
    """--chat sends the prompt as a user message (after --system's) through the chat template and
    tokenizes the rendering without adding special tokens: the same prompt ids and greedy tokens
    as the rendered text given with --no-special."""
    def run(*args):
        p = qs("generate", *args, "-n", "6", "--stats-json", tmp_path / "s.json")
        stats = json.loads((tmp_path / "s.json").read_text())
        return p, (stats["prompt_tokens"], stats["tokens"])

    # The bundled model's own template (tokenizer_config.json).
    p, chat = run("--chat", "--system", "You answer briefly.", "-p", "Who was Moses?")
    assert "chat: the prompt as a user message, template" in p.stderr
    _, plain = run("--no-special", "-p",
                   "<|begin_of_text|>You answer briefly.\n\nUser: Who was Moses?\n\nAssistant:")
    assert chat == plain
    # A built-in one for a model that has none.
    m = model_dir("llama3-tiny")
    p, chat = run("-m", m, "--chat", "--chat-template", "llama3", "-p", "Hello")
    assert "template built-in 'llama3'" in p.stderr
    _, plain = run("-m", m, "--no-special", "-p",
                   "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert chat == plain
    _, raw = run("-m", m, "-p", "Hello")
    assert raw[0] < chat[0]
    p = qs("generate", "-m", m, "--chat", "-p", "Hello", check=False)
    assert_clean_error(p, "the model has no chat template", "--chat-template NAME")
    p = qs("generate", "--chat", "--chat-template", tmp_path / "none.jinja", "-p", "x",
           check=False)
    assert_clean_error(p, "neither a built-in")
    assert qs("generate", "-p", "x", "--system", "y", check=False).returncode == 2


def chat_turns(stderr):
    """(prompt tokens, cached prompt tokens) of each turn's stats line of `quantspec chat`."""
    import re
    return [(int(m[1]), int(m[2]))
            for m in re.finditer(r"^\[(\d+) prompt tokens \((\d+) cached\)", stderr, re.M)]


def test_chat_turns_share_the_prompt_cache(qs, tmp_path):
    """Each stdin line is a user message; a turn renders the whole conversation and prefills only
    what the last one did not (the engine's prompt cache); /reset starts over; -f leads the first
    message with a document, which later turns do not prefill again."""
    def chat(stdin, *args, check=True):
        return qs("chat", "-n", "6", *args, input=stdin, check=check)

    p = chat("Who was Moses?\n\nAnd Aaron?\n/reset\nWho was Moses?\n/exit\nnot read\n")
    turns = chat_turns(p.stderr)
    assert len(turns) == 3, p.stderr
    # The first turn's prompt and reply are kept (the reply's 6 tokens but the last, which the
    # cache never holds): the reply, stored trimmed, renders as the tokens generated.
    assert turns[0][1] == 0 and turns[1][1] == turns[0][0] + 5
    assert turns[1][0] > turns[0][0]
    assert turns[2][0] == turns[0][0]  # after /reset: the first message alone again
    first_reply = p.stdout.split("\n")[0]
    g = qs("generate", "--chat", "-p", "Who was Moses?", "-n", "6")
    assert g.stdout.split("\n")[0] == first_reply
    doc = tmp_path / "doc.txt"
    doc.write_text("And the Lord spake unto Moses, saying, " * 40)
    p = chat("What is this about?\nWho spoke?\n", "-f", doc, "--system", "Be brief.")
    (n1, _), (n2, cached2) = chat_turns(p.stderr)
    assert n1 > 200 and cached2 >= n1
    p = chat("Hello\n", "-m", model_dir("llama3-tiny"), check=False)
    assert_clean_error(p, "the model has no chat template", "--chat-template NAME")
    # A quantized cache cannot be cut back below its last complete group (G = 128): a reply of
    # 200 tokens is reused only because the next prompt repeats it token for token.
    p = qs("chat", "-n", "200", "--ignore-eos", "--mode", "quantspec",
           input="Who was Moses?\nAnd Aaron?\n")
    turns = chat_turns(p.stderr)
    assert turns[1][1] == turns[0][0] + 199, p.stderr
    # Multi-line messages: a trailing backslash continues a line; """ lines enclose a block.
    p = chat('first \\\nsecond\n"""\na\n\nb\n"""\nlast\n')
    assert len(chat_turns(p.stderr)) == 3, p.stderr
    g = qs("generate", "--chat", "-p", "first \nsecond", "-n", "6", "--stats-json",
           tmp_path / "g.json")
    assert chat_turns(p.stderr)[0][0] == json.loads((tmp_path / "g.json").read_text())[
        "prompt_tokens"]
    assert p.stdout.split("\n")[0] == g.stdout.split("\n")[0]


def test_chat_ctrl_c_stops_the_reply_not_the_conversation(qs, request):
    """SIGINT during a reply ends it ("cancelled") and the next line is read; at the prompt SIGINT
    ends the program as usual."""
    import signal
    binary = request.config.getoption("--quantspec")
    p = subprocess.Popen([binary, "chat", "-n", "100000", "--ignore-eos"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdin.write("Who was Moses?\n")
    p.stdin.flush()
    p.stdout.read(8)  # the reply has begun
    p.send_signal(signal.SIGINT)
    p.stdin.write("/reset\n")
    p.stdin.flush()
    time.sleep(2)  # back at the prompt: a second SIGINT ends the program
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGINT, err
    assert "finish: cancelled]" in err and "(a new conversation)" in err


def test_chat_grows_the_context_once_for_a_long_document(qs, model_copy, tmp_path):
    """Without --ctx a conversation past the context grows it to twice what the turn needs (up to
    the model's maximum), so that the next turns keep their cached prefix."""
    d = model_copy("llama3-tiny")
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = 40000
    (d / "config.json").write_text(json.dumps(cfg))
    doc = tmp_path / "doc.txt"
    doc.write_text("word " * 8500)  # past twice the default 8192
    p = qs("chat", "-m", d, "--chat-template", "llama3", "-f", doc, "-n", "4",
           input="first\nsecond\nthird\n")
    turns = chat_turns(p.stderr)
    assert len(turns) == 3 and turns[0][0] > 17000
    assert p.stderr.count("context grown to") == 1
    assert f"context grown to {2 * (turns[0][0] + 4)} tokens" in p.stderr
    assert turns[1][1] >= turns[0][0] and turns[2][1] >= turns[1][0] - 8


def test_nan_weights_are_an_error_not_token_0(qs, model_copy):
    """Corrupt weights (NaN in the embedding) make every logit NaN; sampling them would emit token
    0 over and over with exit status 0."""
    import struct
    d = model_copy("llama3-tiny")
    f = d / "model.safetensors"
    data = bytearray(f.read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    begin, end = header["model.embed_tokens.weight"]["data_offsets"]
    nan = {"F32": b"\x00\x00\xc0\x7f", "F16": b"\x00\x7e",
           "BF16": b"\xc0\x7f"}[header["model.embed_tokens.weight"]["dtype"]]
    width = len(nan)
    data[8 + n + begin:8 + n + end] = nan * ((end - begin) // width)
    f.write_bytes(bytes(data))
    for mode in ("ar", "quantspec"):
        p = qs("generate", "-m", d, "-p", "Hello", "-n", "4", "--mode", mode, check=False)
        assert_clean_error(p, "not finite", "NaN")


def test_unused_checkpoint_tensors_are_warned(qs, model_copy):
    """As transformers' "weights of the model checkpoint not used": biases that config.json turns
    off are named, not dropped silently."""
    d = model_copy("llama2-tiny")
    p = qs("generate", "-m", d, "-p", "x", "-n", "1")
    assert "warning" not in p.stderr
    cfg = json.loads((d / "config.json").read_text())
    cfg["attention_bias"] = False
    (d / "config.json").write_text(json.dumps(cfg))
    p = qs("generate", "-m", d, "-p", "x", "-n", "1")
    assert "tensor(s) of the checkpoint are not used" in p.stderr
    assert "model.layers.0.self_attn.q_proj.bias" in p.stderr


def test_prompt_file_that_is_a_directory(qs, tmp_path):
    p = qs("generate", "-m", model_dir("llama3-tiny"), "-f", tmp_path, "-n", "2", check=False)
    assert_clean_error(p, "is a directory")


def test_context_past_the_models_length_is_warned(qs):
    p = qs("generate", "-m", model_dir("llama3-tiny"), "-p", "x", "-n", "1", "--ctx", "5000")
    assert "warning: the context (5000 tokens) is longer than the model's " \
        "max_position_embeddings (4096)" in p.stderr
    p = qs("generate", "-m", model_dir("llama3-tiny"), "-p", "x", "-n", "1", "--ctx", "4096")
    assert "warning" not in p.stderr


def test_quantized_cache_larger_than_memory_is_refused(qs):
    """The planes are allocated for the whole context at once: past the memory there is, a clear
    error instead of the kernel's OOM kill."""
    model = os.path.join(REPO, "models", "default")
    cfg = json.load(open(os.path.join(model, "config.json")))
    kv_dim = cfg["num_key_value_heads"] * cfg["hidden_size"] // cfg["num_attention_heads"]
    ctx = 1 << 24  # the largest --ctx
    need_kib = ctx * cfg["num_hidden_layers"] * 2 * kv_dim / 1024  # the four 4-bit code planes
    avail_kib = int(next(l.split()[1] for l in open("/proc/meminfo")
                         if l.startswith("MemAvailable:")))
    if need_kib < avail_kib:  # (the planes need more: their scales too)
        pytest.skip("this machine's memory might hold the planes")
    p = qs("generate", "-m", model, "-p", "x", "-n", "1", "--ctx", ctx, "--kv", "int8",
           check=False, timeout=60)
    assert_clean_error(p, "KV planes", "memory is available", "--ctx")


def test_seed_and_budget_out_of_range(qs):
    for args in (("--seed", "-1"), ("--seed", "18446744073709551616"),
                 ("--mode", "snapkv", "--draft-budget", "inf")):
        p = qs("generate", "-m", model_dir("llama3-tiny"), "-p", "x", "-n", "1", *args,
               check=False)
        assert p.returncode in (1, 2) and args[-2] in p.stderr, (args, p.stderr)
    p = qs("generate", "-m", model_dir("llama3-tiny"), "-p", "x", "-n", "1", "--seed",
           "18446744073709551615")
    assert p.returncode == 0


def test_empty_tokenizer_vocab(qs, model_copy):
    d = model_copy("llama3-tiny")
    t = json.loads((d / "tokenizer.json").read_text())
    t["model"]["vocab"], t["model"]["merges"] = {}, []
    (d / "tokenizer.json").write_text(json.dumps(t))
    assert_clean_error(qs("generate", "-m", d, "-p", "Hello", check=False), "'vocab' is empty")


def test_bad_sampling_values(qs):
    for flag, val in (("--temperature", "-1"), ("--temperature", "nan"), ("--top-p", "0"),
                      ("--top-p", "1.5"), ("--min-p", "2")):
        p = qs("generate", "-m", model_dir("llama3-tiny"), "-p", "x", flag, val, check=False)
        assert p.returncode in (1, 2), (flag, val, p.stderr)
        assert "error" in p.stderr.lower() or "Error" in p.stderr


def test_logits_from_token_file_last_rows(qs, tmp_path):
    name = "llama3-tiny"
    ids = np.load(f"{golden_dir(name)}/ids_40.npy")
    ref = np.load(f"{golden_dir(name)}/logits_40.npy")
    ids.astype("<i4").tofile(tmp_path / "ids.i32")
    out = tmp_path / "l.npy"
    qs("logits", "-m", model_dir(name), "--tokens", tmp_path / "ids.i32", "--token-dtype", "i32",
       "--last", "7", "--prefill-chunk", "16", "--out", out)
    got = np.load(out)
    assert got.shape == (7, ref.shape[1])
    assert np.abs(got - ref[-7:]).max() <= 1e-4 * np.abs(ref).max()
    p = qs("logits", "-m", model_dir(name), "--out", out, check=False)
    assert_clean_error(p, "exactly one of --ids or --tokens")


def test_logits_bad_ids(qs, tmp_path):
    p = qs("logits", "-m", model_dir("llama3-tiny"), "--ids", "1,x,3", "--out",
           tmp_path / "o.npy", check=False)
    assert_clean_error(p, "'x'")
    p = qs("logits", "-m", model_dir("llama3-tiny"), "--ids", "99999999", "--out",
           tmp_path / "o.npy", check=False)
    assert_clean_error(p, "vocabulary")


# ---- QuantSpec (issue #3): modes, KV types, eval --------------------------------------------

TEXT = ("Once upon a time there was a little robot who liked to count the stars. Every night it "
        "climbed the hill behind the village and wrote the numbers in a small blue book. ") * 6


def gen_stats(qs, tmp_path, name, *extra):
    stats = tmp_path / f"s{abs(hash(extra))}.json"
    qs("generate", "-m", model_dir(name), "-p", TEXT, "-n", "40", "--ignore-eos",
       "--stats-json", stats, *extra)
    return json.loads(stats.read_text())


@pytest.mark.parametrize("name", ["llama3-tiny", "qwen2-tiny"])
def test_quantspec_greedy_equals_ar_int8(qs, tmp_path, name):
    ar = gen_stats(qs, tmp_path, name, "--mode", "ar", "--kv", "int8", "--group-size", "32")
    for gamma in ("1", "4", "7"):
        s = gen_stats(qs, tmp_path, name, "--mode", "quantspec", "--group-size", "32",
                      "--gamma", gamma)
        assert s["tokens"] == ar["tokens"]
        assert s["mode"] == "quantspec" and s["gamma"] == int(gamma)
        for key in ("acceptance_rate", "mean_accepted_length", "accepted_histogram", "rounds",
                    "draft_s", "verify_s", "flush_s", "sample_s"):
            assert key in s
        assert len(s["accepted_histogram"]) == int(gamma) + 1
        assert sum(s["accepted_histogram"]) == s["rounds"] > 0
        assert s["phase_timing"] == "backend"  # greedy rounds run chained
        assert 0.0 <= s["acceptance_rate"] <= 1.0
        assert s["mean_accepted_length"] == pytest.approx(1 + s["accepted"] / s["rounds"])
        assert s["kv_bytes_per_draft_step"]["lower"] == 0
        assert s["kv_bytes_per_target_step"]["lower"] > 0


def test_quantspec_gamma_auto(qs, tmp_path):
    # Rounds of 0..8 chosen by AdaptiveGamma: still AR INT8's greedy tokens, and the stats say so.
    ar = gen_stats(qs, tmp_path, "llama3-tiny", "--mode", "ar", "--kv", "int8", "--group-size",
                   "32")
    s = gen_stats(qs, tmp_path, "llama3-tiny", "--mode", "quantspec", "--group-size", "32",
                  "--gamma", "auto")
    assert s["tokens"] == ar["tokens"]
    assert s["adaptive_gamma"] is True and s["gamma"] == 8
    assert len(s["accepted_histogram"]) == 9
    assert 0 <= s["drafted"] <= 8 * s["rounds"]  # rounds of 0 (plain steps) draft nothing
    fixed = gen_stats(qs, tmp_path, "llama3-tiny", "--mode", "quantspec", "--gamma", "3")
    assert fixed["adaptive_gamma"] is False and fixed["gamma"] == 3
    # The banner names the choice.
    p = qs("generate", "-m", model_dir("llama3-tiny"), "-p", "Hi", "-n", "4", "--mode",
           "quantspec", "--gamma", "auto")
    assert "gamma auto (0..8 per round)" in p.stderr


def test_bench_sweeps_gamma_auto(qs, tmp_path):
    out = tmp_path / "b.json"
    p = qs("bench", "-m", model_dir("llama3-tiny"), "--modes", "quantspec", "--contexts", "64",
           "--gammas", "2,auto", "-n", "24", "-o", out)
    rows = [line.split() for line in p.stdout.splitlines() if line.startswith("quantspec")]
    assert [r[2] for r in rows] == ["2", "auto"]
    runs = json.loads(out.read_text())["runs"]
    assert [r["adaptive_gamma"] for r in runs] == [False, True]
    assert runs[0]["gamma"] == 2 and runs[1]["gamma"] == 8  # auto drafts up to 8
    assert 1 <= runs[0]["mean_gamma"] <= 2  # the rounds before max_tokens draft fewer
    assert 0 <= runs[1]["mean_gamma"] <= 8  # plain steps (rounds of 0) count too
    assert runs[1]["rounds"] + runs[1]["plain_steps"] >= 1
    bad = qs("bench", "-m", model_dir("llama3-tiny"), "--contexts", "64", "--gammas", "2,fast",
             check=False)
    assert bad.returncode in (1, 2) and "--gammas" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr and "Aborted" not in bad.stderr


def test_kv_modes_and_draft_weights(qs, tmp_path):
    fp = gen_stats(qs, tmp_path, "llama3-tiny", "--kv", "fp16")
    assert fp["mode"] == "ar" and fp["kv"] == "fp16" and fp["generated_tokens"] == 40
    for kv in ("int8", "int4"):
        s = gen_stats(qs, tmp_path, "llama3-tiny", "--kv", kv, "--group-size", "64")
        assert s["kv"] == kv and s["generated_tokens"] == 40
    for dw in ("int4", "int4-mlp", "native"):
        s = gen_stats(qs, tmp_path, "llama3-tiny", "--mode", "quantspec", "--draft-weights", dw,
                      "--value-group-size", "32")
        assert s["generated_tokens"] == 40


@pytest.mark.parametrize("args,needle", [
    (["--mode", "quantspec", "--gamma", "0"], "gamma"),
    (["--mode", "quantspec", "--gamma", "128"], "gamma"),
    (["--mode", "quantspec", "--group-size", "32", "--gamma", "32"], "gamma"),
    (["--mode", "quantspec", "--gamma", "99999999"], "gamma"),
    (["--mode", "quantspec", "--gamma", "fast"], "gamma"),
    (["--mode", "quantspec", "--gamma", "-3"], "gamma"),
    (["--mode", "quantspec", "--kv", "int8"], "--kv"),
    (["--value-group-size", "48"], "value"),
    (["--value-group-size", "16"], "value"),
    (["--group-size", "48"], "group-size"),
    (["--mode", "fast"], "mode"),
    (["--kv", "int2"], "kv"),
    (["--draft-weights", "int3"], "draft-weights"),
])
def test_quantspec_bad_flags(qs, args, needle):
    p = qs("generate", "-m", model_dir("llama3-tiny"), "-p", "hi", "-n", "4", *args, check=False)
    assert p.returncode in (1, 2), p.stderr
    assert needle in p.stderr.lower() or needle in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "Aborted" not in p.stderr


def test_eval_ppl_text_and_tokens(qs, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT * 3)
    out = {}
    for kv in ("fp16", "int8", "int4"):
        p = qs("eval", "ppl", "-m", model_dir("llama3-tiny"), "-f", text, "--ctx", "128",
               "--kv", kv, "--group-size", "32")
        lines = dict(line.split(": ", 1) for line in p.stdout.strip().split("\n"))
        out[kv] = float(lines["ppl"])
        assert int(lines["tokens"]) > 100 and "windows" in lines["method"]
    assert out["fp16"] > 1.0
    assert abs(out["int8"] - out["fp16"]) < abs(out["int4"] - out["fp16"]) + 1e-9
    # Raw token ids: u16 and i32 give the same result; --max-windows evaluates a prefix.
    ids = np.arange(1, 400, dtype=np.int64) * 7 % 2000
    ids.astype("<u2").tofile(tmp_path / "t.u16")
    ids.astype("<i4").tofile(tmp_path / "t.i32")
    a = qs("eval", "ppl", "-m", model_dir("llama3-tiny"), "--tokens", tmp_path / "t.u16",
           "--token-dtype", "u16", "--ctx", "100", "--max-windows", "2").stdout
    b = qs("eval", "ppl", "-m", model_dir("llama3-tiny"), "--tokens", tmp_path / "t.i32",
           "--token-dtype", "i32", "--ctx", "100", "--max-windows", "2").stdout
    assert a == b and "tokens: 200" in a


def test_eval_ppl_is_the_prefill_logits_nll(qs, tmp_path):
    """One window of fp16 KV (where every query reads full precision, as the prefill does): the
    perplexity is exp of the mean negative log-softmax of each next token under `quantspec
    logits`' rows. The window's 100 inputs score 100 targets, the last beyond the inputs."""
    ids = (np.arange(1, 102, dtype=np.int64) * 7919) % 2000
    ids.astype("<i4").tofile(tmp_path / "t.i32")
    p = qs("eval", "ppl", "-m", model_dir("llama3-tiny"), "--tokens", tmp_path / "t.i32",
           "--token-dtype", "i32", "--ctx", "100", "--max-windows", "1", "--kv", "fp16")
    lines = dict(line.split(": ", 1) for line in p.stdout.strip().split("\n"))
    assert lines["tokens"] == "100"
    out = tmp_path / "l.npy"
    qs("logits", "-m", model_dir("llama3-tiny"), "--ids", ",".join(map(str, ids[:100])),
       "--out", out)
    rows = np.load(out).astype(np.float64)
    mx = rows.max(axis=1, keepdims=True)
    log_z = (mx + np.log(np.exp(rows - mx).sum(axis=1, keepdims=True)))[:, 0]
    nll = log_z - rows[np.arange(100), ids[1:101]]
    assert float(lines["ppl"]) == pytest.approx(float(np.exp(nll.mean())), rel=1e-5)


def test_eval_ppl_bad_input(qs, tmp_path):
    odd = tmp_path / "odd.u16"
    odd.write_bytes(b"\x01\x00\x02")
    p = qs("eval", "ppl", "-m", model_dir("llama3-tiny"), "--tokens", odd, check=False)
    assert p.returncode == 1 and "whole number" in p.stderr
    big = tmp_path / "big.u16"
    np.array([1, 60000], dtype="<u2").tofile(big)
    p = qs("eval", "ppl", "-m", model_dir("llama3-tiny"), "--tokens", big, check=False)
    assert p.returncode == 1 and "vocabulary" in p.stderr
    p = qs("eval", "ppl", "-m", model_dir("llama3-tiny"), check=False)
    assert p.returncode == 1


def test_eval_accept_table(qs, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT * 3)
    p = qs("eval", "accept", "-m", model_dir("llama3-tiny"), "-f", text, "--ctx", "20,70",
           "--gamma", "1,3", "-n", "16", "--group-size", "32")
    rows = [line.split() for line in p.stdout.strip().split("\n")]
    assert rows[0][:4] == ["ctx", "gamma", "rounds", "acceptance"]
    body = rows[1:]
    assert [(r[0], r[1]) for r in body] == [("20", "1"), ("20", "3"), ("70", "1"), ("70", "3")]
    for r in body:
        assert 0.0 <= float(r[3]) <= 1.0 and 1.0 <= float(r[4]) <= 1.0 + int(r[1])
    p = qs("eval", "accept", "-m", model_dir("llama3-tiny"), "-f", text, "--ctx", "20",
           "--gamma", "0", check=False)
    assert p.returncode == 1 and "gamma" in p.stderr


@pytest.mark.parametrize("mode", ["streamingllm", "snapkv"])
def test_sparse_draft_greedy_equals_ar_fp16(qs, tmp_path, mode):
    ar = gen_stats(qs, tmp_path, "llama3-tiny", "--mode", "ar")
    s = gen_stats(qs, tmp_path, "llama3-tiny", "--mode", mode, "--draft-budget", "0.2",
                  "--gamma", "3", "--draft-weights", "native")
    assert s["tokens"] == ar["tokens"]
    assert s["mode"] == mode and s["gamma"] == 3 and s["rounds"] > 0
    assert s["draft_index_bytes"] > 0
    assert s["kv_bytes_per_draft_step"]["fp"] < s["kv_bytes_per_target_step"]["fp"]


@pytest.mark.parametrize("args,needle", [
    (["--mode", "snapkv", "--draft-budget", "0"], "budget"),
    (["--mode", "streamingllm", "--kv", "int8"], "--kv"),
    (["--mode", "snapkv", "--snap-window", "0"], "snap-window"),
])
def test_sparse_draft_bad_flags(qs, args, needle):
    p = qs("generate", "-m", model_dir("llama3-tiny"), "-p", "hi", "-n", "4", *args, check=False)
    assert p.returncode in (1, 2), p.stderr
    assert needle in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "Aborted" not in p.stderr


def test_eval_accept_sparse_modes(qs, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT * 3)
    for mode in ("streamingllm", "snapkv"):
        p = qs("eval", "accept", "-m", model_dir("llama3-tiny"), "-f", text, "--ctx", "70",
               "--gamma", "3", "-n", "16", "--mode", mode)
        rows = [line.split() for line in p.stdout.strip().split("\n")]
        assert rows[1][:2] == ["70", "3"] and 0.0 <= float(rows[1][3]) <= 1.0
    p = qs("eval", "accept", "-m", model_dir("llama3-tiny"), "-f", text, "--ctx", "20",
           "--gamma", "1", "--mode", "ar", check=False)
    assert p.returncode in (1, 2) and "mode" in p.stderr


def test_bench_matrix_table_and_json(qs, tmp_path):
    out = tmp_path / "bench.json"
    p = qs("bench", "-m", model_dir("llama3-tiny"), "--contexts", "40,90", "--modes",
           "ar-fp16,quantspec", "--gammas", "1,3", "-n", "12", "--group-size", "32",
           "--repeats", "2", "-o", out)
    rows = [line.split() for line in p.stdout.strip().split("\n")]
    assert rows[0][0] == "device:" and rows[1][:4] == ["mode", "context", "gamma", "rep"]
    body = rows[2:]
    # ar: 2 contexts x 2 repeats; quantspec: 2 contexts x 2 gammas x 2 repeats.
    assert len(body) == 4 + 8
    assert [r[0] for r in body] == ["ar-fp16"] * 4 + ["quantspec"] * 8
    report = json.loads(out.read_text())
    assert report["command"] == "bench" and report["backend"] == "cpu" and report["commit"]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True)
    if head.returncode == 0 and not os.environ.get("QS_COMMIT"):
        # The commit of the build, not of the configure: the tree's, "-dirty" when edited.
        assert report["commit"].split("-")[0] == head.stdout.strip()
    assert not os.path.isabs(report["model"])  # reports name no machine's paths
    # The quantized views' attention arithmetic: the CPU's is exact whatever the GPU choices.
    assert report["draft_attention"] == report["target_attention"] == "exact"
    runs = report["runs"]
    assert len(runs) == 12
    for r in runs:
        assert r["generated_tokens"] == 12 and r["prompt_tokens"] == r["context"]
        assert r["ms_per_token"] > 0 and r["decode_tok_s"] > 0
        # Per decoded token: the first of the 12 came from the prompt's logits.
        assert r["ms_per_token"] == pytest.approx(1e3 * r["decode_s"] / 11, rel=1e-9)
        assert r["decode_tok_s"] == pytest.approx(11 / r["decode_s"], rel=1e-9)
    spec = [r for r in runs if r["bench_mode"] == "quantspec"]
    assert sorted({r["gamma"] for r in spec}) == [1, 3]
    assert all(r["drafted"] > 0 and 0 <= r["acceptance_rate"] <= 1 for r in spec)
    # A flush's own cost: the commits that quantized a group, a part of every commit's time.
    for r in runs:
        assert 0 <= r["flushing_commit_s"] <= r["flush_s"]
        assert (r["flush_ms_per_flush"] > 0) == (r["flushes"] > 0)
        if r["flushes"]:
            assert r["flush_ms_per_flush"] == pytest.approx(
                1e3 * r["flushing_commit_s"] / r["flushes"], rel=1e-9)
    assert any(r["flushes"] > 0 for r in spec)
    # "resolved configuration once at start": one banner per engine (mode).
    assert p.stderr.count("quantspec bench: model") == 2
    assert all(r["kv_buffer"] == "f32" for r in runs)  # the CPU's default rows
    qs("bench", "-m", model_dir("llama3-tiny"), "--contexts", "40", "--modes", "ar-fp16,quantspec",
       "--gammas", "2", "-n", "6", "--group-size", "32", "--kv-dtype", "f16", "-o", out)
    assert all(r["kv_buffer"] == "f16" for r in json.loads(out.read_text())["runs"])
    # Without --ctx each context runs on a cache of its own size: the quantized planes (allocated
    # for the capacity) of the 40-token runs are smaller than those of the 90-token runs; with
    # --ctx 256 the same 40-token run holds planes for 256 positions.
    # (12 tokens, the sweep's largest γ 3 and the bonus token past the prompt.)
    assert all(r["max_context"] == r["context"] + 12 + 3 + 1 for r in runs)
    kv = {(r["context"], r["gamma"]): r["kv_cache_bytes"] for r in spec}
    assert kv[(40, 1)] < kv[(90, 1)] and kv[(40, 3)] < kv[(90, 3)]
    qs("bench", "-m", model_dir("llama3-tiny"), "--contexts", "40", "--modes", "quantspec",
       "--gammas", "1", "-n", "12", "--group-size", "32", "--ctx", "256", "-o", out)
    fixed = json.loads(out.read_text())["runs"]
    assert fixed[0]["max_context"] == 256 and fixed[0]["kv_cache_bytes"] > kv[(40, 1)]


def test_bench_json_survives_a_killed_run(qs, request, tmp_path):
    """The --json report is rewritten (whole, via a rename) after every run: a bench stopped by a
    time limit keeps what it measured. An unwritable path fails before any benchmark runs."""
    p = qs("bench", "-m", model_dir("llama3-tiny"), "--contexts", "40", "-o",
           tmp_path / "no-such-dir" / "b.json", check=False)
    assert p.returncode == 1 and "cannot write --json file" in p.stderr
    assert "quantspec bench: model" not in p.stderr  # nothing was loaded or run
    out = tmp_path / "b.json"
    proc = subprocess.Popen([request.config.getoption("--quantspec"), "bench", "-m",
                             model_dir("llama3-tiny"), "--contexts", "40", "--modes", "ar-fp16",
                             "-n", "16", "--repeats", "1000", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        runs = []
        while time.time() < deadline and len(runs) < 3:
            time.sleep(0.05)
            if out.exists():
                runs = json.loads(out.read_text())["runs"]  # always a whole report
        assert len(runs) >= 3, "no runs reached the report"
        assert proc.poll() is None, "the bench finished: it should still be running"
    finally:
        proc.kill()
        proc.wait()
    report = json.loads(out.read_text())
    assert report["command"] == "bench" and report["device"] and len(report["runs"]) >= 3
    assert all(r["generated_tokens"] == 16 for r in report["runs"])


def test_every_kernel_switch_is_recorded():
    """Each QS_* switch the sources read (env_flag / env_int / getenv) is in report.cpp's list, so
    an A/B run's JSON names its arm (tools/gpu/ab_summary.py groups by it)."""
    import re
    names = set()
    for root, _, files in os.walk(os.path.join(REPO, "src")):
        for f in files:
            if f.endswith((".cpp", ".cu", ".h", ".cuh")):
                text = open(os.path.join(root, f), encoding="utf-8").read()
                names |= set(re.findall(r'(?:env_flag|env_int|getenv)\("(QS_[A-Z0-9_]+)"', text))
    listed = open(os.path.join(REPO, "app", "cli", "report.cpp"), encoding="utf-8").read()
    listed = listed[listed.index("kernel_switches()"):]
    listed = set(re.findall(r'"(QS_[A-Z0-9_]+)"', listed[:listed.index("};")]))
    not_switches = {"QS_KERNEL_TRACE_FILE"}  # a file name, not a kernel choice
    assert len(names) > 20
    assert names - not_switches <= listed, sorted(names - not_switches - listed)


def test_bench_records_kernel_switches(qs, tmp_path, monkeypatch):
    """The environment's kernel switches (A/B runs) are printed with the configuration and kept
    in the bench JSON; none set: an empty object and no line."""
    out = tmp_path / "b.json"
    args = ("bench", "-m", model_dir("llama3-tiny"), "--contexts", "40", "--modes", "ar-fp16",
            "-n", "2", "-o", out)
    for name in ("QS_DIRECT_RING", "QS_Q4_KERNEL", "QS_CUDA_PDL"):
        monkeypatch.delenv(name, raising=False)
    p = qs(*args)
    assert "kernel switches" not in p.stderr
    assert json.loads(out.read_text())["kernel_switches"] == {}
    monkeypatch.setenv("QS_DIRECT_RING", "0")
    monkeypatch.setenv("QS_Q4_KERNEL", "6")
    p = qs(*args)
    assert "kernel switches from the environment: QS_Q4_KERNEL=6 QS_DIRECT_RING=0" in p.stderr
    assert json.loads(out.read_text())["kernel_switches"] == {"QS_Q4_KERNEL": "6",
                                                              "QS_DIRECT_RING": "0"}


def test_bench_report_tables_and_plots(qs, tmp_path):
    out = tmp_path / "bench.json"
    qs("bench", "-m", model_dir("llama3-tiny"), "--contexts", "40,90", "--modes",
       "ar-fp16,ar-int8,quantspec", "--gammas", "1,2", "-n", "8", "--group-size", "32", "-o", out)
    md = tmp_path / "r.md"
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "bench_report.py"), str(out),
                    "--markdown", str(md), "--plots", str(tmp_path / "img")], check=True,
                   capture_output=True)
    text = md.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| 40 |") or
            line.startswith("| 90 |")]
    # 3 best-per-mode rows + 2 sweep rows per context.
    assert len(rows) == 2 * (3 + 2)
    fp16 = [r for r in rows if "| ar-fp16 |" in r]
    assert all("| 1.00x |" in r for r in fp16)
    for name in ("speedup", "acceptance", "memory"):
        assert (tmp_path / "img" / f"bench-{name}.png").stat().st_size > 1000


def test_bench_report_projection(tmp_path):
    """The projected ms/token from phase times: (γ·draft + verify + host) / ((1 - α^(γ+1)) / (1 - α)),
    host = the round's sampling + flush time when the run recorded it."""
    def run(mode, ms, gamma=0, draft=0.0, verify=0.0):
        return {"bench_mode": mode, "context": 1000, "gamma": gamma, "ms_per_token": ms,
                "decode_tok_s": 1000.0 / ms, "acceptance_rate": 0.0, "mean_accepted_length": 1.0,
                "draft_ms_per_step": draft, "verify_ms_per_step": verify, "prefill_s": 0.1,
                "drafted": 8 if gamma else 0}
    report = {"command": "bench", "model": "m", "config": {}, "runs": [
        run("ar-fp16", 12.0), run("ar-int8", 9.0), run("quantspec", 30.0, 4, 6.0, 10.0)]}
    path = tmp_path / "b.json"
    path.write_text(json.dumps(report))
    md = subprocess.run([sys.executable, os.path.join(REPO, "tools", "bench_report.py"), str(path)],
                        check=True, capture_output=True, text=True).stdout
    row = next(line for line in md.splitlines() if line.startswith("| quantspec | 1000 | 4 |"))
    # α = 0.9: E = (1 - 0.9^5) / 0.1 = 4.0951; (4·6 + 10) / 4.0951 = 8.30 ms: 1.45x / 1.08x.
    assert "8.30 (1.45x, 1.08x)" in row, row
    # α = 0.85: E = 3.7086 -> 9.17 ms; α = 0.95: E = 4.5244 -> 7.51 ms.
    assert "9.17 (1.31x, 0.98x)" in row and "7.51 (1.60x, 1.20x)" in row, row
    # With the host's sampling + flush recorded (0.03 s + 0.01 s over 20 rounds = 2 ms per round):
    # α = 0.9: (4·6 + 10 + 2) / 4.0951 = 8.79 ms, 1.37x / 1.02x.
    report["runs"][2].update(sample_s=0.03, flush_s=0.01, rounds=20)
    path.write_text(json.dumps(report))
    md = subprocess.run([sys.executable, os.path.join(REPO, "tools", "bench_report.py"), str(path)],
                        check=True, capture_output=True, text=True).stdout
    row = next(line for line in md.splitlines() if line.startswith("| quantspec | 1000 | 4 |"))
    assert "| 2.000 |" in row and "8.79 (1.37x, 1.02x)" in row, row


def test_bench_report_merge_and_projected_plot(tmp_path):
    """--merge joins files of one model (one device call per context) into one report; its
    projected-speedup plot uses each mode's best γ at α = 0.9; files of another model are refused."""
    pytest.importorskip("matplotlib")

    def run(mode, ctx, ms, gamma=0, draft=0.0, verify=0.0):
        return {"bench_mode": mode, "context": ctx, "gamma": gamma, "ms_per_token": ms,
                "decode_tok_s": 1000.0 / ms, "acceptance_rate": 0.0, "mean_accepted_length": 1.0,
                "draft_ms_per_step": draft, "verify_ms_per_step": verify, "prefill_s": 0.1,
                "drafted": 8 if gamma else 0}
    cfg = {"layers": 2, "hidden": 64}
    a = {"command": "bench", "model": "m", "config": cfg, "commit": "c1", "runs": [
        run("ar-fp16", 1000, 12.0), run("quantspec", 1000, 30.0, 4, 6.0, 10.0),
        run("quantspec", 1000, 30.0, 2, 6.0, 9.0)]}
    b = {"command": "bench", "model": "m", "config": cfg, "commit": "c2", "runs": [
        run("ar-fp16", 4000, 20.0), run("quantspec", 4000, 40.0, 4, 8.0, 12.0)]}
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    tool = os.path.join(REPO, "tools", "bench_report.py")
    md = subprocess.run([sys.executable, tool, str(pa), str(pb), "--merge", "both", "--plots",
                         str(tmp_path / "img")], check=True, capture_output=True, text=True).stdout
    assert md.count("### ") == 1 and "`a.json`, `b.json`" in md and "c1, c2" in md
    assert "| quantspec | 1000 | 4 |" in md and "| quantspec | 4000 | 4 |" in md
    # Best γ at 1000: γ = 4 gives (4·6 + 10) / 4.0951 = 8.30 ms, γ = 2 (2·6 + 9) / 2.71 = 7.75.
    assert "7.75 (1.55x, -)" in md
    assert (tmp_path / "img" / "both-projected-speedup.png").stat().st_size > 1000
    b["config"] = {"layers": 3, "hidden": 64}
    pb.write_text(json.dumps(b))
    p = subprocess.run([sys.executable, tool, str(pa), str(pb), "--merge", "both"],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "another model" in p.stderr


def test_bench_report_hf_reference(tmp_path):
    """tools/hf_decode_bench.py's rows merge with `quantspec bench` files of the same model (the
    config keys both record must agree) and add a "vs HF" speedup to the projection."""
    def run(mode, ms, gamma=0, draft=0.0, verify=0.0):
        return {"bench_mode": mode, "context": 1000, "gamma": gamma, "ms_per_token": ms,
                "decode_tok_s": 1000.0 / ms, "acceptance_rate": 0.0, "mean_accepted_length": 1.0,
                "draft_ms_per_step": draft, "verify_ms_per_step": verify, "prefill_s": 0.1,
                "drafted": 8 if gamma else 0}
    ours = {"command": "bench", "model": "m", "config": {"layers": 2, "hidden": 64, "vocab": 9},
            "runs": [run("ar-fp16", 12.0), run("ar-int8", 9.0),
                     run("quantspec", 30.0, 4, 6.0, 10.0)]}
    hf = {"command": "bench", "tool": "hf_decode_bench", "model": "m",
          "config": {"layers": 2, "hidden": 64}, "runs": [run("hf-transformers", 16.6)]}
    pa, pb = tmp_path / "ours.json", tmp_path / "hf.json"
    pa.write_text(json.dumps(ours))
    pb.write_text(json.dumps(hf))
    tool = os.path.join(REPO, "tools", "bench_report.py")
    md = subprocess.run([sys.executable, tool, str(pa), str(pb), "--merge", "m"], check=True,
                        capture_output=True, text=True).stdout
    assert "| 1000 | hf-transformers |" in md
    row = next(line for line in md.splitlines() if line.startswith("| quantspec | 1000 | 4 |"))
    # α = 0.9: 8.30 ms/token (see test_bench_report_projection); 16.6 / 8.30 = 2.00x.
    assert "8.30 (1.45x, 1.08x, 2.00x)" in row, row
    hf["config"]["hidden"] = 128
    pb.write_text(json.dumps(hf))
    p = subprocess.run([sys.executable, tool, str(pa), str(pb), "--merge", "m"],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "another model" in p.stderr


def test_bench_bad_input(qs, tmp_path):
    p = qs("bench", "-m", model_dir("llama3-tiny"), "--contexts", "40", "--modes", "fast",
           check=False)
    assert p.returncode == 2 and "fast" in p.stderr
    p = qs("bench", "-m", model_dir("llama3-tiny"), check=False)
    assert p.returncode == 2 and "--contexts" in p.stderr
    short = tmp_path / "short.u16"
    short.write_bytes(b"\x01\x00\x02\x00")
    p = qs("bench", "-m", model_dir("llama3-tiny"), "--contexts", "40", "--prompt-tokens", short,
           check=False)
    assert p.returncode == 1 and "fewer than the longest context" in p.stderr


def test_hf_decode_bench_writes_bench_json(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "hf.json"
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "hf_decode_bench.py"), "--model",
                    model_dir("llama3-tiny"), "--contexts", "20,40", "--tokens", "4", "--device",
                    "cpu", "--dtype", "float32", "-o", str(out)], check=True, capture_output=True)
    report = json.loads(out.read_text())
    assert report["command"] == "bench" and report["tool"] == "hf_decode_bench"
    assert [r["context"] for r in report["runs"]] == [20, 40]
    assert all(r["bench_mode"] == "hf-transformers" and r["ms_per_token"] > 0
               for r in report["runs"])
    md = subprocess.run([sys.executable, os.path.join(REPO, "tools", "bench_report.py"), str(out)],
                        check=True, capture_output=True, text=True).stdout
    assert "| 20 | hf-transformers |" in md


def test_json_schema(qs, tmp_path):
    # --json-schema / --json-schema-file: QuantSpec gives AR INT8's greedy tokens under the same
    # schema; a finished output is a document the schema accepts, its properties in the schema's
    # order; bad schemas and flag combinations are clear errors before the model loads.
    import jsonschema
    schema = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 30},
                                               "names": {"type": "array", "items": {"type": "string", "maxLength": 5},
                                                         "maxItems": 2}},
              "required": ["kind", "age"]}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    ar = gen_stats(qs, tmp_path, "llama3-tiny", "--mode", "ar", "--kv", "int8", "--group-size", "32",
                   "--json-schema-file", str(path))
    s = gen_stats(qs, tmp_path, "llama3-tiny", "--mode", "quantspec", "--group-size", "32",
                  "--gamma", "4", "--json-schema", json.dumps(schema))
    assert s["tokens"] == ar["tokens"] and s["drafted"] > 0
    finished = 0
    for seed in ("1", "2", "3", "4"):
        p = qs("generate", "-m", model_dir("llama3-tiny"), "-p", "A pet in JSON:", "-n", "96",
               "--json-schema-file", str(path), "--temperature", "1", "--seed", seed)
        assert "format json-schema" in p.stderr
        if "finish: stop" in p.stderr:
            doc = json.loads(p.stdout)
            jsonschema.validate(doc, schema)
            assert list(doc) == [k for k in ("kind", "age", "names") if k in doc], p.stdout
            finished += 1
        else:
            assert p.stdout.lstrip(" \t\r\n").startswith("{"), p.stdout
    assert finished > 0
    for args, want in ((["--json-schema", '{"type": "object", "patternProperties": {"^a": {}}}'], "'patternProperties' is not supported"),
                       (["--json-schema", '{"type": "string", "pattern": "(?=a)"}'], "lookahead"),
                       (["--json-schema", "{"], "not valid JSON"),
                       (["--json-schema-file", str(tmp_path / "missing.json")], "missing.json"),
                       (["--json-schema", "{}", "--format", "json"], "excludes"),
                       (["--json-schema", "{}", "--json-schema-file", str(path)], "excludes")):
        bad = qs("generate", "-m", model_dir("llama3-tiny"), "-p", "x", *args, check=False)
        assert bad.returncode == 2 and want in bad.stderr, bad.stderr


def test_format_json(qs, tmp_path):
    # JSON mode: QuantSpec gives AR INT8's greedy tokens under the same masks; the output opens an
    # object, and parses as one when generation stopped on it; the banner says so.
    ar = gen_stats(qs, tmp_path, "llama3-tiny", "--mode", "ar", "--kv", "int8", "--group-size", "32",
                   "--format", "json")
    s = gen_stats(qs, tmp_path, "llama3-tiny", "--mode", "quantspec", "--group-size", "32",
                  "--gamma", "4", "--format", "json")
    assert s["tokens"] == ar["tokens"]
    assert s["drafted"] > 0
    plain = gen_stats(qs, tmp_path, "llama3-tiny", "--mode", "ar", "--kv", "int8", "--group-size", "32")
    assert plain["tokens"] != ar["tokens"]  # the mask changes the output
    for seed in ("1", "2", "3"):
        p = qs("generate", "-m", model_dir("llama3-tiny"), "-p", "JSON:", "-n", "64", "--format", "json",
               "--temperature", "1", "--seed", seed)
        assert "format json" in p.stderr
        assert p.stdout.lstrip(" \t\r\n").startswith("{"), p.stdout
        if "finish: stop" in p.stderr:
            assert isinstance(json.loads(p.stdout), dict), p.stdout
    bad = qs("generate", "-m", model_dir("llama3-tiny"), "-p", "x", "--format", "yaml", check=False)
    assert bad.returncode == 2 and "--format" in bad.stderr
    # chat: every reply is JSON mode's (the same first reply as generate --chat --format json).
    p = qs("chat", "-n", "12", "--format", "json", "--mode", "quantspec",
           input="Who was Moses? Answer in JSON.\nAnd Aaron?\n")
    assert len(chat_turns(p.stderr)) == 2 and "format json" in p.stderr
    g = qs("generate", "--chat", "-p", "Who was Moses? Answer in JSON.", "-n", "12", "--format", "json",
           "--mode", "quantspec")
    assert p.stdout.startswith(g.stdout.rstrip("\n")), (p.stdout, g.stdout)
    assert g.stdout.lstrip(" \t\r\n").startswith("{"), g.stdout
