#!/usr/bin/env python3
"""Trains the byte-level BPE tokenizer and pre-tokenizes the corpus for train.py.

Step 2 of the pipeline (see tools/train/README.md); runs on the CPU machine, after
build_corpus.py. Output (the folder that travels to the GPU machine):

  OUT/tokenizer.json, OUT/tokenizer_config.json   the tokenizer (Llama-3 structure, below)
  OUT/train.u16.xz, OUT/heldout.u16.xz              token streams, raw little-endian uint16, xz
  OUT/data.json                                    stream lengths, document offsets, corpus
                                                   summary, tokenizer facts, sha256 of streams

Tokenizer: the same structure as models/tokenizers/bytelevel (Llama-3 / Qwen2 style):
Split(Llama-3 regex, isolated) + ByteLevel(add_prefix_space=false, use_regex=false), BPE with
ignore_merges=true, ByteLevel decoder, post-processor ByteLevel + TemplateProcessing
"<|begin_of_text|> $A". --vocab-size ids in all: the trained tokens, then the special tokens
<|begin_of_text|> and <|end_of_text|> as the last two ids. Trained on the train split only.

Streams: each document is encoded without special tokens, documents shorter than --min-doc-tokens
are dropped, and each kept document is stored as <|begin_of_text|> tokens... <|end_of_text|>.
Train documents are shuffled (seeded) so sources interleave; held-out documents keep the corpus
order. `doc_starts` in data.json are the offsets of each document's BOS.

  tools/train/prepare_data.py [--corpus .train/corpus] [--out .train/gpu] [--vocab-size 8192]
"""
import argparse
import hashlib
import json
import lzma
import os
import random
import sys
import time

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from tokenizers import trainers

kLlama3Pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
kBos = "<|begin_of_text|>"
kEos = "<|end_of_text|>"


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)
        f.write("\n")


def train_tokenizer(texts, vocab_size):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(kLlama3Pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    n_trained = vocab_size - 2
    trainer = trainers.BpeTrainer(vocab_size=n_trained, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(texts, trainer, length=len(texts))
    if tok.get_vocab_size() != n_trained:
        sys.exit(f"prepare_data.py: the BPE trainer made {tok.get_vocab_size()} tokens, "
                 f"expected {n_trained} (corpus too small for --vocab-size?)")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (kBos, kEos)])
    bos_id = tok.token_to_id(kBos)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{kBos} $A", pair=f"{kBos} $A {kBos} $B:1",
                                      special_tokens=[(kBos, bos_id)]),
    ])
    data = json.loads(tok.to_str())
    # train_from_iterator resets the model options; ignore_merges is what Llama-3 files carry.
    data["model"]["ignore_merges"] = True
    tok = Tokenizer.from_str(json.dumps(data))
    assert tok.get_vocab_size(with_added_tokens=True) == vocab_size
    return tok, data


def tokenizer_config(tok):
    added = {}
    for id_, t in sorted(tok.get_added_tokens_decoder().items()):
        added[str(id_)] = {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized,
                           "rstrip": t.rstrip, "single_word": t.single_word, "special": t.special}
    return {"add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": added,
            "bos_token": kBos, "clean_up_tokenization_spaces": False, "eos_token": kEos,
            "model_max_length": 16384, "tokenizer_class": "PreTrainedTokenizerFast"}


def write_stream(path, tokens):
    raw = tokens.astype("<u2").tobytes()
    with lzma.open(path, "wb", preset=9 | lzma.PRESET_EXTREME) as f:
        f.write(raw)
    return hashlib.sha256(raw).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=".train/corpus")
    ap.add_argument("--out", default=".train/gpu")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--min-doc-tokens", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--max-docs", type=int, default=0, help="use only the first N (tests)")
    args = ap.parse_args()
    if args.vocab_size > 65536:
        sys.exit("prepare_data.py: --vocab-size must be <= 65536 (tokens are stored as uint16)")

    docs = []
    with open(os.path.join(args.corpus, "docs.jsonl"), encoding="utf-8") as f:
        for line in f:
            docs.append(json.loads(line))
            if args.max_docs and len(docs) >= args.max_docs:
                break
    with open(os.path.join(args.corpus, "summary.json"), encoding="utf-8") as f:
        corpus_summary = json.load(f)
    train_texts = [d["text"] for d in docs if d["split"] == "train"]
    print(f"{len(docs)} documents ({len(train_texts)} train); training the tokenizer...",
          flush=True)

    t0 = time.time()
    tok, tok_json = train_tokenizer(train_texts, args.vocab_size)
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "tokenizer.json"), tok_json)
    write_json(os.path.join(args.out, "tokenizer_config.json"), tokenizer_config(tok))
    reloaded = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
    probe = "Hello, world!  It's 2024 — naïve café 日本語 🙂\n\tdef f(x): return x"
    assert reloaded.encode(probe).ids == tok.encode(probe).ids
    assert reloaded.decode(reloaded.encode(probe, add_special_tokens=False).ids) == probe
    bos_id, eos_id = tok.token_to_id(kBos), tok.token_to_id(kEos)
    print(f"tokenizer: {args.vocab_size} ids (bos {bos_id}, eos {eos_id}) in "
          f"{time.time() - t0:.0f} s; encoding...", flush=True)

    t0 = time.time()
    encodings = tok.encode_batch([d["text"] for d in docs], add_special_tokens=False)
    print(f"encoded in {time.time() - t0:.0f} s", flush=True)

    per_source = {}
    splits = {"train": [], "heldout": []}
    n_chars = {"train": 0, "heldout": 0}
    dropped = 0
    for d, enc in zip(docs, encodings):
        ids = enc.ids
        stats = per_source.setdefault(d["source"], {"train": [0, 0], "heldout": [0, 0],
                                                    "dropped_short": 0})
        if len(ids) < args.min_doc_tokens:
            stats["dropped_short"] += 1
            dropped += 1
            continue
        splits[d["split"]].append(np.asarray([bos_id] + ids + [eos_id], dtype=np.uint16))
        stats[d["split"]][0] += 1
        stats[d["split"]][1] += len(ids) + 2
        n_chars[d["split"]] += len(d["text"])
    random.Random(args.seed).shuffle(splits["train"])

    meta = {"vocab_size": args.vocab_size, "bos_token_id": bos_id, "eos_token_id": eos_id,
            "min_doc_tokens": args.min_doc_tokens, "seed": args.seed,
            "document_format": "<|begin_of_text|> text <|end_of_text|>, concatenated",
            "corpus": corpus_summary, "tokens_per_source": {}, "splits": {}}
    for name, stats in per_source.items():
        meta["tokens_per_source"][name] = {
            "train_docs": stats["train"][0], "train_tokens": stats["train"][1],
            "heldout_docs": stats["heldout"][0], "heldout_tokens": stats["heldout"][1],
            "dropped_short_docs": stats["dropped_short"]}
    for split, arrays in splits.items():
        if not arrays:
            sys.exit(f"prepare_data.py: no {split} document has >= {args.min_doc_tokens} tokens")
        lengths = np.array([len(a) for a in arrays], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        tokens = np.concatenate(arrays)
        digest = write_stream(os.path.join(args.out, f"{split}.u16.xz"), tokens)
        meta["splits"][split] = {"file": f"{split}.u16.xz", "tokens": int(len(tokens)),
                                 "docs": len(arrays), "chars": n_chars[split],
                                 "sha256": digest, "doc_starts": starts.tolist(),
                                 "median_doc_tokens": int(np.median(lengths)),
                                 "max_doc_tokens": int(lengths.max())}
        size = os.path.getsize(os.path.join(args.out, f"{split}.u16.xz"))
        print(f"{split}: {len(arrays)} documents, {len(tokens):,} tokens "
              f"({n_chars[split] / len(tokens):.2f} chars/token), median document "
              f"{int(np.median(lengths)):,} tokens; {size / 1e6:.1f} MB compressed", flush=True)
    write_json(os.path.join(args.out, "data.json"), meta)
    print(f"dropped {dropped} documents under {args.min_doc_tokens} tokens; wrote {args.out}")
    for name, s in meta["tokens_per_source"].items():
        print(f"  {name:18s} train {s['train_docs']:4d} docs {s['train_tokens'] / 1e6:6.2f}M tok"
              f"   held-out {s['heldout_docs']:3d} docs {s['heldout_tokens'] / 1e6:5.2f}M tok"
              f"   dropped {s['dropped_short_docs']}")


if __name__ == "__main__":
    main()
