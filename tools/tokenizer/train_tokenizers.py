#!/usr/bin/env python3
"""Trains the two small test tokenizers committed under models/tokenizers/.

  bytelevel/  Llama-3 / Qwen2 style byte-level BPE (Split with the Llama-3 regex, then ByteLevel),
              ignore_merges=True, BOS added by a TemplateProcessing post-processor.
  spm/        Llama-2 / Mistral style SentencePiece BPE: Prepend("▁") + Replace(" ", "▁")
              normalizer, no pre-tokenizer, byte_fallback, fuse_unk, <unk> <s> </s> <0x00>..<0xFF>.

Both have exactly kVocabSize = 2048 ids, added tokens included. Each folder gets tokenizer.json and
tokenizer_config.json (the fields HF's save_pretrained writes that we use).

Deterministic: the text comes from make_corpus.py (sorted local files, no randomness) and the
`tokenizers` BPE trainer has no random state (ties are broken by pair order). The text depends on
the installed Debian packages, so the outputs are committed, and the sha256 of the text they were
trained on is kCommittedCorpusSha256: with other text the vocabulary differs, which would break
everything built on the committed files (tests/data/tokenizer goldens, models/test/*), so writing
into models/tokenizers then needs --force (then re-run make_goldens.py and the test-model script).
Takes a few seconds.

Usage: train_tokenizers.py [OUT_DIR] [--force]    (default OUT_DIR: <repo>/models/tokenizers)
"""
import argparse
import collections
import json
import os
import sys

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_corpus  # noqa: E402

kVocabSize = 2048
# make_corpus.corpus_sha256 of the text the committed tokenizers were trained on.
kCommittedCorpusSha256 = "a72345a12fadd05e435067ab96b1718e4586efe217c840c1c0b3200b48ab8d6c"
kLlama3Pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
kRepoRoot = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

kByteLevelSpecial = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
                     "<|start_header_id|>", "<|end_header_id|>"]
# Non-special added tokens (Qwen-style <think> tags): decoded even with skip_special_tokens.
kByteLevelAdded = [AddedToken("<think>", special=False, normalized=False),
                   AddedToken("</think>", special=False, normalized=False)]

kSpmAlphabetSize = 160
kSpmSpecial = ["<unk>", "<s>", "</s>"]
# Added tokens exercising the flags: matched after normalization, lstrip/rstrip, single_word.
kSpmAdded = [AddedToken("[INST]", special=False, normalized=True),
             AddedToken("<|sep|>", special=False, normalized=False, lstrip=True, rstrip=True),
             AddedToken("<mask>", special=True, normalized=False, single_word=True)]


def added_token_json(tok):
    return {"content": tok.content, "lstrip": tok.lstrip, "normalized": tok.normalized,
            "rstrip": tok.rstrip, "single_word": tok.single_word, "special": tok.special}


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)
        f.write("\n")


def write_config(out_dir, tok, bos, eos, add_bos, tokenizer_class, as_objects):
    added = {}
    for id_, t in sorted(tok.get_added_tokens_decoder().items()):
        added[str(id_)] = added_token_json(t)

    def token_field(content):
        if not as_objects:
            return content
        t = tok.get_added_tokens_decoder()[tok.token_to_id(content)]
        return dict(__type="AddedToken", **added_token_json(t))

    config = {"add_bos_token": add_bos, "add_eos_token": False, "added_tokens_decoder": added,
              "bos_token": token_field(bos), "clean_up_tokenization_spaces": False,
              "eos_token": token_field(eos), "model_max_length": 131072,
              "tokenizer_class": tokenizer_class}
    if tokenizer_class == "LlamaTokenizer":
        config["legacy"] = True
        config["unk_token"] = token_field("<unk>")
    write_json(os.path.join(out_dir, "tokenizer_config.json"), config)


def train_bytelevel(lines, out_dir):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(kLlama3Pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    n_trained = kVocabSize - len(kByteLevelSpecial) - len(kByteLevelAdded)
    trainer = trainers.BpeTrainer(vocab_size=n_trained, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(lines, trainer)
    assert tok.get_vocab_size() == n_trained, tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in kByteLevelSpecial])
    tok.add_tokens(kByteLevelAdded)
    bos_id = tok.token_to_id("<|begin_of_text|>")
    # Llama-3.1 layout: ByteLevel (offsets only) then the BOS template.
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos_id)]),
    ])
    data = json.loads(tok.to_str())
    data["model"]["ignore_merges"] = True
    tok = Tokenizer.from_str(json.dumps(data))
    assert tok.get_vocab_size(with_added_tokens=True) == kVocabSize
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, "tokenizer.json"), data)
    write_config(out_dir, tok, "<|begin_of_text|>", "<|end_of_text|>", True,
                 "PreTrainedTokenizerFast", as_objects=False)
    return tok


def train_spm(lines, out_dir):
    # Train on Metaspace-split words so pieces start at word boundaries as SentencePiece's do;
    # the saved tokenizer uses the Llama-2 normalizer form with no pre-tokenizer.
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                         split=True)
    n_fixed = len(kSpmSpecial) + 256
    n_trained = kVocabSize - n_fixed - len(kSpmAdded)
    # The trainer's own limit_alphabet breaks frequency ties in hash order (not reproducible), so
    # the alphabet is chosen here: the kSpmAlphabetSize most frequent characters, ties by code
    # point. Rarer characters are left to byte fallback, like SentencePiece's character_coverage.
    counts = collections.Counter()
    for line in lines:
        counts.update(line.replace(" ", "▁"))
        counts["▁"] += 1
    alphabet = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:kSpmAlphabetSize]
    alphabet = [c for c, _ in alphabet]
    trainer = trainers.BpeTrainer(vocab_size=n_trained, min_frequency=2, show_progress=False,
                                  initial_alphabet=alphabet, limit_alphabet=len(alphabet),
                                  special_tokens=[])
    trainer_tok.train_from_iterator(lines, trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    assert len(trained["vocab"]) == n_trained, len(trained["vocab"])

    vocab = {t: i for i, t in enumerate(kSpmSpecial)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        assert piece not in vocab, f"trained piece {piece!r} collides with a fixed token"
        vocab[piece] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                               byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in kSpmSpecial])
    tok.add_tokens([t for t in kSpmAdded if not t.special])
    tok.add_special_tokens([t for t in kSpmAdded if t.special])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", vocab["<s>"])])
    data = json.loads(tok.to_str())
    # Older files (Llama-2, Mistral) store merges as "a b" strings; keep that format here so the
    # loader is tested on both (bytelevel/ uses the newer [a, b] pairs).
    data["model"]["merges"] = [f"{a} {b}" for a, b in merges]
    tok = Tokenizer.from_str(json.dumps(data))
    assert tok.get_vocab_size(with_added_tokens=True) == kVocabSize
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, "tokenizer.json"), data)
    write_config(out_dir, tok, "<s>", "</s>", True, "LlamaTokenizer", as_objects=True)
    return tok


def main():
    default_root = os.path.join(kRepoRoot, "models", "tokenizers")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", nargs="?", default=default_root)
    parser.add_argument("--force", action="store_true",
                        help="write into models/tokenizers even if the training text changed")
    args = parser.parse_args()
    out_root = args.out_dir
    docs = make_corpus.corpus_documents()
    sha = make_corpus.corpus_sha256(docs)
    if sha != kCommittedCorpusSha256:
        print(f"warning: the training text (sha256 {sha}) is not the one the committed tokenizers "
              f"were trained on ({kCommittedCorpusSha256}); the vocabulary will differ.")
        if os.path.abspath(out_root) == os.path.abspath(default_root) and not args.force:
            sys.exit("refusing to overwrite models/tokenizers: pass --force (and then re-run "
                     "make_goldens.py and rebuild models/test), or give another OUT_DIR")
    lines = make_corpus.corpus_lines(docs)
    print(f"training on {len(lines)} lines, {sum(len(x) for x in lines)} characters")
    for name, fn in (("bytelevel", train_bytelevel), ("spm", train_spm)):
        out_dir = os.path.join(out_root, name)
        tok = fn(lines, out_dir)
        reloaded = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
        sample = "Hello, world!  It's 2024 — naïve café 日本語 🙂\n\tdef f(x): return x"
        assert reloaded.encode(sample).ids == tok.encode(sample).ids
        assert reloaded.get_vocab_size(with_added_tokens=True) == kVocabSize
        print(f"{name}: {kVocabSize} ids -> {out_dir}; sample: {reloaded.encode(sample).tokens}")


if __name__ == "__main__":
    main()
