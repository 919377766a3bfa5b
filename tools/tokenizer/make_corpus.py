#!/usr/bin/env python3
"""Training text for the test tokenizers, taken only from files a fresh Debian machine has.

Sources, in this order, each list sorted by path so the result is deterministic on a given machine:
  1. /usr/share/common-licenses/*            (whole files)
  2. /usr/share/doc/*/copyright               (first 16 KB of each, duplicates skipped, 1.5 MB cap)
  3. /usr/lib/python3*/*.py                   (standard-library modules, 2 MB cap)
Files that are not valid UTF-8 are skipped. No randomness is involved; the text depends only on
which Debian packages are installed (installing or removing one changes it), which is why the
trained tokenizers are committed and train_tokenizers.py checks the text's sha256.

Usage: make_corpus.py OUT.txt      (one document per line-block; prints a summary)
"""
import glob
import hashlib
import os
import sys

kDocCap = 16 * 1024
kCopyrightTotalCap = 1_500_000
kPythonTotalCap = 2_000_000


def _read_utf8(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def corpus_documents():
    """Returns a list of (source_path, text) in a fixed order."""
    docs = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path) and not os.path.islink(path):
            text = _read_utf8(path)
            if text:
                docs.append((path, text))

    seen = set()
    total = 0
    for path in sorted(glob.glob("/usr/share/doc/*/copyright")):
        text = _read_utf8(path)
        if not text:
            continue
        text = text[:kDocCap]
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        if total + len(text) > kCopyrightTotalCap:
            break
        docs.append((path, text))
        total += len(text)

    total = 0
    for path in sorted(glob.glob("/usr/lib/python3*/*.py")):
        text = _read_utf8(path)
        if not text:
            continue
        if total + len(text) > kPythonTotalCap:
            continue  # a smaller later module may still fit
        docs.append((path, text))
        total += len(text)
    return docs


def corpus_text(docs):
    """The documents as one text, each ending in a newline (what main() writes)."""
    return "".join(text if text.endswith("\n") else text + "\n" for _, text in docs)


def corpus_sha256(docs):
    return hashlib.sha256(corpus_text(docs).encode("utf-8")).hexdigest()


def corpus_lines(docs):
    """Training sequences: every non-empty line of every document, newline kept."""
    lines = []
    for _, text in docs:
        for line in text.splitlines(keepends=True):
            if line.strip():
                lines.append(line)
    return lines


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    docs = corpus_documents()
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        f.write(corpus_text(docs))
    n_chars = sum(len(t) for _, t in docs)
    print(f"{len(docs)} documents, {n_chars} characters, sha256 {corpus_sha256(docs)} "
          f"-> {sys.argv[1]}")


if __name__ == "__main__":
    main()
