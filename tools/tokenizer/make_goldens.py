#!/usr/bin/env python3
"""Test corpus and golden encodings for the C++ tokenizer (tests/tokenizer/).

Writes, under tests/data/tokenizer/:
  corpus.jsonl               {"text": ...} per line: hand-written tricky cases plus strings
                             generated with random.Random(kSeed) (prose, code, scripts, emoji, ...)
  golden_<name>.jsonl        per corpus line, from HF `tokenizers` on models/tokenizers/<name>:
                             {"ids": encode(text, add_special_tokens=False),
                              "ids_special": encode(text, add_special_tokens=True),
                              "decoded": decode(ids_special),
                              "decoded_skip": decode(ids_special, skip_special_tokens=True)}
  variants.json              tokenizers derived from the two above by replacing top-level parts
                             (normalizer, pre_tokenizer, post_processor, decoder, ...), to cover
                             components the two do not use (NFC, Metaspace, Digits, Split
                             behaviors, Roberta, ...)
  golden_variant_<name>.jsonl  like golden_<name>.jsonl for the corpus strings of at most
                             kVariantMaxChars characters, with their corpus "index"
  golden_decode_<name>.jsonl random id sequences (byte tokens, specials, out-of-range ids) and
                             {"ids", "decoded", "decoded_skip"} for them

Deterministic: fixed seed, no input but the committed tokenizers. Re-run after re-training them.
Usage: make_goldens.py
"""
import json
import os
import random
import unicodedata

from tokenizers import Tokenizer

kSeed = 20240611
kRepoRoot = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
kDataDir = os.path.join(kRepoRoot, "tests", "data", "tokenizer")
kTokenizers = ("bytelevel", "spm")
kMaxGoldenBytes = 2_000_000
kVariantMaxChars = 300
kQwen2Pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def split(pattern, behavior, invert=False, regex=True):
    return {"type": "Split", "pattern": {"Regex" if regex else "String": pattern},
            "behavior": behavior, "invert": invert}


def byte_level(add_prefix_space, use_regex):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True,
            "use_regex": use_regex}


def metaspace(scheme, split_):
    return {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": split_}


def template(tokens_before, tokens_after, ids):
    single = ([{"SpecialToken": {"id": t, "type_id": 0}} for t in tokens_before] +
              [{"Sequence": {"id": "A", "type_id": 0}}] +
              [{"SpecialToken": {"id": t, "type_id": 0}} for t in tokens_after])
    pair = single + [{"Sequence": {"id": "B", "type_id": 1}}]
    specials = {t: {"id": t, "ids": [ids[t]], "tokens": [t]} for t in tokens_before + tokens_after}
    return {"type": "TemplateProcessing", "single": single, "pair": pair,
            "special_tokens": specials}


# Variants: base tokenizer + replaced top-level parts ("model.<key>" sets a model field).
kVariants = {
    # Qwen2: NFC, one digit per pre-token, no BOS.
    "qwen2": ("bytelevel", {
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split(kQwen2Pattern, "Isolated"), byte_level(False, False)]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "model.ignore_merges": False,
    }),
    # GPT-2 / RoBERTa style: NFKC, Digits, ByteLevel with its own regex and prefix space.
    "gpt2": ("bytelevel", {
        "normalizer": {"type": "NFKC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level(True, True)]},
        "post_processor": {"type": "RobertaProcessing", "sep": ["<|end_of_text|>", 2042],
                           "cls": ["<|begin_of_text|>", 2041], "trim_offsets": True,
                           "add_prefix_space": True},
        "model.ignore_merges": False,
    }),
    # Every split behavior, inverted matching, string patterns, contiguous digits.
    "splits": ("bytelevel", {
        "normalizer": {"type": "NFD"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            split(" ", "MergedWithPrevious", regex=False),
            {"type": "Digits", "individual_digits": False},
            split("[.;]", "Removed"),
            split("[A-Z]", "MergedWithNext"),
            split("[a-z]+", "Isolated", invert=True),
            split("\\s+", "Contiguous"),
            byte_level(False, False)]},
    }),
    # Llama-2 (legacy=false) / Mistral: Metaspace "first" without splitting, Metaspace decoder.
    "spm_first": ("spm", {
        "normalizer": None,
        "pre_tokenizer": metaspace("first", False),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"}, metaspace("first", True)]},
    }),
    # Metaspace "always" with splitting, BOS and EOS, NFKC normalizer.
    "spm_always": ("spm", {
        "normalizer": {"type": "NFKC"},
        "pre_tokenizer": metaspace("always", True),
        "post_processor": template(["<s>"], ["</s>"], {"<s>": 1, "</s>": 2}),
    }),
}


def make_variant(base_json, patch):
    data = json.loads(base_json)
    for key, value in patch.items():
        if key.startswith("model."):
            data["model"][key[len("model."):]] = value
        else:
            data[key] = value
    return data

kWords = ("the of and to in is you that it he was for on are as with his they I at be this have "
          "from or one had by word but not what all were we when your can said there use an each "
          "which she do how their if will up other about out many then them these so some her "
          "would make like him into time has look two more write go see number no way could "
          "people my than first water been call who oil its now find long down day did get come "
          "made may part license software copyright permission warranty function return value "
          "tokenizer speculative quantized cache attention").split()

kSnippets = [
    "def f(x):\n    return x * 2  # double\n",
    "class Foo(Bar):\n\tdef __init__(self, *args, **kwargs):\n\t\tsuper().__init__()\n",
    "for i in range(10):\n    print(f\"{i:03d}\", end='')\n",
    "if __name__ == \"__main__\":\n    main()\n",
    "#include <stdio.h>\nint main(void) {\n  printf(\"hello\\n\");\n  return 0;\n}\n",
    "static inline uint32_t rotl(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }",
    "for (int i = 0; i < n; ++i) { a[i] += b[i] * c; }",
    "template <typename T>\nT max(const T& a, const T& b) { return a < b ? b : a; }\n",
    "{\"name\": \"quantspec\", \"version\": [0, 1, 0], \"ok\": true, \"x\": null}",
    "{\n  \"a\": {\"b\": [1, 2.5e-3, -7]},\n  \"s\": \"\\u00e9\\n\"\n}",
    "#!/bin/sh\nset -eu\nfor f in *.txt; do wc -l \"$f\"; done | sort -n > /tmp/out.log 2>&1\n",
    "grep -rn 'TODO' src/ | awk -F: '{print $1}' | uniq -c",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "x = [i**2 for i in range(100) if i % 3 == 0]",
    "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
    "    \n\t\t\n  return;\r\n}\r\n",
    "a_b_c = __dunder__ + _private - CONSTANT_VALUE",
    "https://example.com/path?q=1&r=two#frag",
    "user@example.org, +1 (555) 123-4567",
]

kScripts = {
    "cjk": "日本語のテキストです。中文文本，包括标点符号！한국어 문장입니다. 漢字かな交じり文",
    "arabic": "مرحبا بالعالم، هذا نص عربي للاختبار. السَّلَامُ عَلَيْكُمْ",
    "hebrew": "שלום עולם! זהו טקסט בעברית עם ניקוד: בְּרֵאשִׁית",
    "devanagari": "नमस्ते दुनिया। यह हिन्दी पाठ है। क्षत्रिय ज्ञान",
    "thai": "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "cyrillic": "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "greek": "Γειά σου Κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "emoji": "🙂😀👍🏽👩‍💻👨‍👩‍👧‍👦🏳️‍🌈🇩🇪🇯🇵❤️‍🔥✋🏿🧑🏻‍🤝‍🧑🏿",
    "math": "∀x∈ℝ: x² ≥ 0 ⇒ √(x²) = |x|; ∑ᵢ aᵢ ≈ ∫ f(t) dt ≠ ∞",
    "latin": "naïve café résumé Ærøskøbing Straße façade coöperate Œuvre ñandú",
}


def special_strings(name):
    tok = Tokenizer.from_file(os.path.join(kRepoRoot, "models", "tokenizers", name,
                                           "tokenizer.json"))
    return [t.content for t in tok.get_added_tokens_decoder().values()]


def hand_written():
    out = [
        "", " ", "  ", "\n", "\t", "\r\n", "\r", " \n ", "\n\n\n", "a", "A", "é", "e\u0301",
        "Hello world", "Hello, world!", " Hello world", "Hello world ", "  leading two",
        "trailing two  ", "   ", "\t\tindented\ttabs\t", "mixed \t \n \r\n whitespace",
        "line1\r\nline2\r\nline3\r\n", "a\n\nb\n\n\nc", "end with newline\n", "\n\nstart",
        "x" * 50, " " * 40, "\n" * 20, "\t" * 17, " \t" * 10, "ab" * 64,
        "1", "12", "123", "1234", "12345", "123456789012345678901234567890",
        "3.14159265358979323846264338327950288419716939937510",
        "Phone: 0800-123-4567, zip 90210, year 1999/2000.", "x1y22z333w4444",
        "١٢٣٤٥ ٦٧٨٩٠ (Arabic-Indic digits) ０１２３ (full-width)",
        "I'm", "I'M", "you're", "YOU'RE", "we've", "WE'VE", "she'll", "SHE'LL", "he'd", "HE'D",
        "it's", "IT'S", "don't", "DON'T", "Don'T", "they'Re", "'s 't 're", "''", "'", "'''s",
        "rock 'n' roll", "the dog's bone's", "O'Neil's", "l'homme", "’s curly ’t",
        "e\u0301cole", "\u00e9cole", "Å", "A\u030a", "\u212b", "ﬁ ligature", "Ｆｕｌｌｗｉｄｔｈ",
        "\u0000", "\u0001\u0002\u0003", "\u007f", "\u0085", "\u00a0nbsp\u00a0", "\u200b", "\u200d",
        "\ufeffBOM", "\u2028\u2029", "\u3000ideographic space", "a\u0300\u0301\u0302\u0303",
        "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǫ̗͕̈́", "\U0001F600", "\U0010FFFF", "\uFFFD", "\uE000 private use",
        "🙂", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇩🇪", "1️⃣", "©️ ®️ ™️",
        "日本", "中", "한", "ع", "ש", "क्ष", "ก", "a日b本c", "Hello日本World",
        # Characters where regex engines disagree on \\s or case folding.
        "\u180e", "a\u180eb", "a \u180e b", "\u0085x", "x\u0085", "\x1c\x1d\x1e\x1f", "x\x0b\x0cy",
        "x \x0b y", "ſ's", "İ'S", "K'D", "ﬆ'll", "a\u2000\u2001b", "\u202f'\u205f",
    ]
    for key in sorted(kScripts):
        out.append(kScripts[key])
    out.extend(kSnippets)
    # Added and special tokens written literally, alone and glued to text and whitespace.
    literal = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
               "<|end_header_id|>", "<think>", "</think>", "<unk>", "<s>", "</s>", "[INST]",
               "<|sep|>", "<mask>", "<0x41>", "<0xE6>", "▁", "▁▁hello", "Ġhello", "Ċ"]
    for t in literal:
        out += [t, f"a{t}b", f" {t} ", f"  {t}  x", f"\n{t}\n", f"{t}{t}", f"word{t}",
                f"{t}word", f"hello {t}world", f"hello{t} world"]
    out += [
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        "<think>\nLet me reason.\n</think>\n\nAnswer: 42",
        "<s>[INST] What is 2+2? [/INST] 4</s><s>[INST] And 3+3? [/INST]",
        "<|begin_of_text", "<|begin_of_text|", "|>", "<think", "think>", "<<s>>", "<s<s>>",
        "[INST][INST]", "[ INST]", "[inst]", "<MASK>", "x <mask> y", "x<mask>y", "x <mask>y",
        "<mask>.", "(<mask>)", "é<mask>é", "1<mask>2", "_<mask>_",
        "a <|sep|> b", "a<|sep|>b", "a\t\n<|sep|>\n\tb", "  <|sep|>  ", "<|sep|>",
        "a  [INST]  b", " [INST]", "[INST] ", "x▁[INST]▁y",
    ]
    return out


def random_prose(rng):
    n = rng.randint(3, 40)
    words = []
    for _ in range(n):
        w = rng.choice(kWords)
        r = rng.random()
        if r < 0.1:
            w = w.capitalize()
        elif r < 0.13:
            w = w.upper()
        words.append(w)
        if rng.random() < 0.08:
            words[-1] += rng.choice([",", ".", ";", ":", "!", "?", "'s", "'t", "'LL", "n't"])
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice([".", "!", "?", "", "\n", " "])


def random_unicode(rng):
    ranges = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x5ff),
              (0x600, 0x6ff), (0x900, 0x97f), (0xe00, 0xe7f), (0x3040, 0x30ff),
              (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0x1f300, 0x1f6ff), (0x1f900, 0x1f9ff),
              (0x0300, 0x036f), (0x2000, 0x206f), (0x10000, 0x1007f)]
    out = []
    for _ in range(rng.randint(1, 30)):
        lo, hi = rng.choice(ranges)
        out.append(chr(rng.randint(lo, hi)))
        if rng.random() < 0.15:
            out.append(rng.choice([" ", "  ", "\n", "\t", "'s", "123"]))
    return "".join(out)


def random_whitespace_mix(rng):
    pieces = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "a", "bc", "Def", "1", "42", "'ll",
              "!", "?!", "...", "->", "()", "日", "é", "🙂", "\u3000", "\v", "\f"]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(1, 25)))


def random_digits(rng):
    n = rng.randint(1, 60)
    s = "".join(rng.choice("0123456789") for _ in range(n))
    return rng.choice(["", " ", "x", "v", "$"]) + s + rng.choice(["", " ", ".", "px", "\n"])


def random_code(rng):
    parts = [rng.choice(kSnippets) for _ in range(rng.randint(1, 3))]
    text = "".join(parts)
    if rng.random() < 0.3:
        text = text.replace("    ", "\t")
    if rng.random() < 0.3:
        text = text.replace("\n", "\r\n")
    return text


def random_special_mix(rng, specials):
    pieces = specials + [" ", "  ", "\n", "hello", "World", "日本", "🙂", "'s", "x", ".", "12"]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))


def random_single_char(rng):
    return chr(rng.choice([rng.randint(0, 0x7f), rng.randint(0x80, 0x7ff),
                           rng.randint(0x800, 0xd7ff), rng.randint(0xe000, 0xfffd),
                           rng.randint(0x10000, 0x10ffff)]))


def long_string(rng, n_chars):
    parts = []
    size = 0
    while size < n_chars:
        r = rng.random()
        if r < 0.5:
            p = random_prose(rng) + " "
        elif r < 0.7:
            p = random_code(rng)
        elif r < 0.85:
            p = random_unicode(rng)
        else:
            p = random_whitespace_mix(rng)
        parts.append(p)
        size += len(p)
    return "".join(parts)


def build_corpus():
    rng = random.Random(kSeed)
    specials = sorted(set(special_strings("bytelevel") + special_strings("spm")))
    corpus = hand_written()
    for _ in range(120):
        corpus.append(random_prose(rng))
    for _ in range(60):
        corpus.append(random_code(rng))
    for _ in range(100):
        corpus.append(random_unicode(rng))
    for _ in range(60):
        corpus.append(random_whitespace_mix(rng))
    for _ in range(40):
        corpus.append(random_digits(rng))
    for _ in range(60):
        corpus.append(random_special_mix(rng, specials))
    for _ in range(40):
        corpus.append(random_single_char(rng))
    # NFC / NFD forms of the same text.
    for key in sorted(kScripts):
        for form in ("NFC", "NFD", "NFKC"):
            corpus.append(unicodedata.normalize(form, kScripts[key]))
    for _ in range(6):
        corpus.append(long_string(rng, rng.randint(2000, 6000)))
    corpus.append(("All work and no play makes Jack a dull boy. " * 120).strip())
    corpus.append("0123456789" * 300)
    corpus.append(" " * 3000 + "x")
    corpus.append("日本語のテキスト。" * 300)
    return corpus


def random_id_sequences(rng, tok):
    vocab = tok.get_vocab_size(with_added_tokens=True)
    added = sorted(tok.get_added_tokens_decoder())
    byte_ids = [i for i in range(vocab) if (tok.id_to_token(i) or "").startswith("<0x")]
    seqs = [[], [vocab], [-1 & 0x7fffffff], list(range(min(vocab, 300)))]
    for _ in range(150):
        seq = []
        for _ in range(rng.randint(1, 40)):
            r = rng.random()
            if r < 0.15:
                seq.append(rng.choice(added))
            elif r < 0.35 and byte_ids:
                seq.append(rng.choice(byte_ids))
            elif r < 0.38:
                seq.append(vocab + rng.randint(0, 5))  # out of range: HF drops it
            else:
                seq.append(rng.randrange(vocab))
        seqs.append(seq)
    return seqs


def main():
    corpus = build_corpus()
    os.makedirs(kDataDir, exist_ok=True)
    with open(os.path.join(kDataDir, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for text in corpus:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    print(f"corpus: {len(corpus)} strings")
    for name in kTokenizers:
        tok = Tokenizer.from_file(os.path.join(kRepoRoot, "models", "tokenizers", name,
                                               "tokenizer.json"))
        path = os.path.join(kDataDir, f"golden_{name}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for text in corpus:
                ids = tok.encode(text, add_special_tokens=False).ids
                ids_special = tok.encode(text, add_special_tokens=True).ids
                row = {"ids": ids, "ids_special": ids_special,
                       "decoded": tok.decode(ids_special, skip_special_tokens=False),
                       "decoded_skip": tok.decode(ids_special, skip_special_tokens=True)}
                f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
        size = os.path.getsize(path)
        assert size < kMaxGoldenBytes, f"{path} is {size} bytes"
        rng = random.Random(kSeed + 1)
        path_decode = os.path.join(kDataDir, f"golden_decode_{name}.jsonl")
        with open(path_decode, "w", encoding="utf-8") as f:
            for seq in random_id_sequences(rng, tok):
                row = {"ids": seq, "decoded": tok.decode(seq, skip_special_tokens=False),
                       "decoded_skip": tok.decode(seq, skip_special_tokens=True)}
                f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
        print(f"{name}: {path} ({size} bytes), {path_decode}")

    variants = {}
    for name, (base, patch) in kVariants.items():
        variants[name] = {"base": base, "patch": patch}
        with open(os.path.join(kRepoRoot, "models", "tokenizers", base, "tokenizer.json"),
                  encoding="utf-8") as f:
            tok = Tokenizer.from_str(json.dumps(make_variant(f.read(), patch)))
        path = os.path.join(kDataDir, f"golden_variant_{name}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for index, text in enumerate(corpus):
                if len(text) > kVariantMaxChars:
                    continue
                ids_special = tok.encode(text, add_special_tokens=True).ids
                row = {"index": index, "ids": tok.encode(text, add_special_tokens=False).ids,
                       "ids_special": ids_special,
                       "decoded": tok.decode(ids_special, skip_special_tokens=False),
                       "decoded_skip": tok.decode(ids_special, skip_special_tokens=True)}
                f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
        print(f"variant {name}: {path} ({os.path.getsize(path)} bytes)")
    with open(os.path.join(kDataDir, "variants.json"), "w", encoding="utf-8") as f:
        json.dump(variants, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
