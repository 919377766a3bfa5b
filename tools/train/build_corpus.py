#!/usr/bin/env python3
"""Builds the training corpus of the bundled model from freely licensed Debian packages.

Step 1 of the pipeline (see tools/train/README.md). Reads only files that the Debian packages in
kSources install, cleans them to plain text, makes long documents, removes duplicates and splits
train / held-out by document. No network, no randomness beyond a seeded hash.

  apt-get install -y $(tools/train/build_corpus.py --print-packages)
  tools/train/build_corpus.py [--out .train/corpus] [--seed 1234] [--heldout-frac 0.03]

Output: OUT/docs.jsonl (one {"id", "source", "split", "text"} per line, fixed order) and
OUT/summary.json (documents and characters per source and split, packages with versions).

Documents: a file is one document when it is long on its own (>= kMinDocChars characters, about
7K tokens); shorter files are joined in path order with the other short files of their folder
into documents of about kGroupChars characters. Sources whose files are pages of one book in
reading order (the Bible's books, the PostgreSQL manual, the Debian handbook, the Jargon File's
entries, the Debian Reference) are joined in that order the same way, so short pages still give
long coherent documents. Documents under kMinDocChars are dropped here, and prepare_data.py later
drops those under 8192 tokens. Some sources are capped (max_chars) to keep the mix balanced.

Deduplication: exact duplicates (after cleaning) are dropped, and so is a document whose long lines
(>= 50 characters) were mostly (> 50%) seen in earlier documents.

Split: in each source, documents are ordered by sha256(seed:id) and the first
round(heldout_frac * n) (at least 1 when n >= 4) are held out.
"""
import argparse
import collections
import glob
import gzip
import hashlib
import html.parser
import json
import os
import re
import subprocess
import sys

kMinDocChars = 24_000
kGroupChars = 60_000
kDupLineChars = 50
kDupLineFrac = 0.5


class Source:
    def __init__(self, name, packages, license_, description, reader, max_chars=None):
        self.name = name
        self.packages = packages
        self.license = license_
        self.description = description
        self.reader = reader
        # Cap on the source's kept text; documents are taken in seeded split_key order up to it.
        self.max_chars = max_chars


# ---------------------------------------------------------------------------------------------
# Text helpers

_kControl = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_kManyBlank = re.compile(r"\n{3,}")


def clean_text(text):
    """Unix newlines, no control characters but tab and newline, no trailing spaces, at most one
    blank line in a row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x0c", "\n")
    text = _kControl.sub("", text)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = _kManyBlank.sub("\n\n", text)
    return text.strip("\n") + "\n"


def read_text(path):
    """File contents as str (gzip-aware); None when unreadable or not UTF-8."""
    try:
        opener = gzip.open if path.endswith((".gz", ".dz")) else open
        with opener(path, "rb") as f:
            return f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError):
        return None


class _HtmlToText(html.parser.HTMLParser):
    kSkipTags = {"script", "style", "head", "form", "select", "svg", "noscript", "map"}
    kSkipClasses = {"navheader", "navfooter", "nosearch", "docnav", "toc", "menu", "searchmenu",
                    "breadcrumbs", "indexterm", "headerlink", "sphinxsidebar", "related", "nav",
                    "footer"}
    kSkipIds = {"banner", "breadcrumbs", "navigation", "hd", "ft", "sidebar", "global-nav",
                "searchbox", "nav", "footer", "topbar", "menu"}
    kVoid = {"br", "img", "hr", "meta", "link", "input", "area", "base", "col", "wbr", "param",
             "source", "embed", "track"}
    kBlock = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "table", "ul", "ol", "dl",
              "blockquote", "section", "pre", "article", "header", "footer", "figure", "center"}
    kLine = {"li", "tr", "dt", "dd", "br", "hr", "caption"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out = []
        self.skip_tag = None   # tag name of the element being skipped
        self.skip_depth = 0    # nesting of skip_tag inside it
        self.pre_depth = 0

    def _newline(self, n):
        if self.out and self.out[-1] == "- ":
            return  # a block right inside <li> stays on the bullet's line
        self.out.append("\n" * n)

    def handle_starttag(self, tag, attrs):
        if self.skip_tag is not None:
            if tag == self.skip_tag and tag not in self.kVoid:
                self.skip_depth += 1
            return
        attrs = dict(attrs)
        classes = set((attrs.get("class") or "").split())
        if tag in self.kSkipTags or classes & self.kSkipClasses or attrs.get("id") in self.kSkipIds:
            if tag not in self.kVoid:
                self.skip_tag, self.skip_depth = tag, 1
            return
        if tag == "pre":
            self.pre_depth += 1
        if tag in self.kBlock:
            self._newline(2)
        elif tag in self.kLine:
            self._newline(1)
            if tag == "li":
                self.out.append("- ")
        elif tag in ("td", "th"):
            self.out.append(" ")

    def handle_endtag(self, tag):
        if self.skip_tag is not None:
            if tag == self.skip_tag:
                self.skip_depth -= 1
                if self.skip_depth == 0:
                    self.skip_tag = None
            return
        if tag == "pre" and self.pre_depth > 0:
            self.pre_depth -= 1
        if tag in self.kBlock:
            self._newline(2)

    def handle_data(self, data):
        if self.skip_tag is not None:
            return
        if self.pre_depth > 0:
            self.out.append(data)
            return
        collapsed = re.sub(r"\s+", " ", data)
        # Whitespace of the markup at a line start is not text; <pre> indentation is kept above.
        if not self.out or self.out[-1].endswith("\n"):
            collapsed = collapsed.lstrip()
        if collapsed:
            self.out.append(collapsed)

    def text(self):
        return clean_text("".join(self.out))


def html_to_text(markup):
    p = _HtmlToText()
    p.feed(markup)
    p.close()
    return p.text()


def group_units(units, prefix):
    """Joins (unit_id, text) in order into documents of >= kGroupChars characters. A short
    remainder is appended to the last document."""
    docs = []
    cur_ids, cur_texts, cur_len = [], [], 0
    for uid, text in units:
        cur_ids.append(uid)
        cur_texts.append(text)
        cur_len += len(text)
        if cur_len >= kGroupChars:
            docs.append((f"{prefix}{cur_ids[0]}..{cur_ids[-1]}", "\n".join(cur_texts)))
            cur_ids, cur_texts, cur_len = [], [], 0
    if cur_texts:
        if docs and cur_len < kGroupChars // 2:
            last_id, last_text = docs.pop()
            docs.append((f"{last_id.split('..')[0]}..{cur_ids[-1]}",
                         last_text + "\n" + "\n".join(cur_texts)))
        else:
            docs.append((f"{prefix}{cur_ids[0]}..{cur_ids[-1]}", "\n".join(cur_texts)))
    return docs


def files_as_docs(paths, root, convert=None, group_short=True):
    """One document per file of >= kMinDocChars characters. With group_short, shorter files are
    joined in path order with the other short files of their folder (group_units)."""
    docs = []
    short = collections.OrderedDict()  # folder -> [(relpath, text)]
    for path in paths:
        text = read_text(path)
        if text is None:
            continue
        if convert is not None:
            text = convert(text)
        rel = os.path.relpath(path, root)
        if len(text) >= kMinDocChars or not group_short:
            docs.append((rel, text))
        else:
            short.setdefault(os.path.dirname(rel), []).append((rel, text))
    for units in short.values():
        docs.extend(group_units(units, ""))
    return docs


def chunk_text(text, prefix):
    """Splits one very long text at blank lines into documents of about kGroupChars."""
    paragraphs = text.split("\n\n")
    return group_units([(f"p{i}", p + "\n") for i, p in enumerate(paragraphs)], prefix)


def html_reading_order(directory):
    """Pages of a DocBook HTML book in reading order, following rel="next" from index.html."""
    order, seen = [], set()
    page = "index.html"
    next_re = re.compile(r'<link rel="next" href="([^"#]+)"')
    while page and page not in seen and os.path.exists(os.path.join(directory, page)):
        seen.add(page)
        order.append(page)
        markup = read_text(os.path.join(directory, page)) or ""
        m = next_re.search(markup)
        page = m.group(1) if m else None
    return order


# ---------------------------------------------------------------------------------------------
# Sources

def read_kjv():
    out = subprocess.run(["bible", "-l", "1000000", "Gen1:1-Rev22:21"], check=True,
                         capture_output=True, text=True).stdout
    books = collections.OrderedDict()
    book = None
    header = re.compile(r"^(\S.*) (\d+)$")
    for line in out.split("\n"):
        m = header.match(line)
        if m:
            book = m.group(1)
            chapter = m.group(2)
            books.setdefault(book, []).append(f"\nChapter {chapter}\n")
        elif line.strip() and book is not None:
            books[book].append(line.strip())
    units = [(name, f"The Book of {name}\n" + "\n".join(lines)) for name, lines in books.items()]
    return group_units(units, "")


def read_jargon():
    text = read_text("/usr/share/dictd/jargon.dict.dz")
    # The dictd file starts with database headers (00-database-*); entries follow, each a
    # non-indented headword line followed by indented text.
    start = text.find("\n(TM)\n")
    body = text[start + 1:] if start >= 0 else text
    entries = re.split(r"\n(?=\S)", body)
    units = []
    for e in entries:
        head = e.split("\n", 1)[0].strip()
        units.append((head, e))
    return group_units(units, "")


def read_python_doc():
    root = "/usr/share/doc/python3.11/html/_sources"
    paths = sorted(glob.glob(f"{root}/**/*.rst.txt", recursive=True))
    return files_as_docs(paths, root)


def read_python_stdlib():
    root = "/usr/lib/python3.11"
    paths = sorted(p for p in glob.glob(f"{root}/**/*.py", recursive=True)
                   if "/site-packages/" not in p and "/dist-packages/" not in p)
    return files_as_docs(paths, root)


def read_perl_doc():
    root = "/usr/share/perl/5.36/pod"
    skip = {"perltoc.pod", "perluniprops.pod"}  # generated tables of contents and properties
    paths = sorted(p for p in glob.glob(f"{root}/*.pod") if os.path.basename(p) not in skip)
    return files_as_docs(paths, root)


def read_postgresql_doc():
    root = "/usr/share/doc/postgresql-doc-15/html"
    skip = {"bookindex.html"}
    units = []
    for page in html_reading_order(root):
        if page in skip:
            continue
        text = html_to_text(read_text(os.path.join(root, page)) or "")
        units.append((page, text))
    return group_units(units, "")


def read_sqlite_doc():
    root = "/usr/share/doc/sqlite3"
    # Generated cross-reference indexes, syntax-diagram galleries and requirement lists.
    skip = re.compile(r"^(doc_.*crossref|syntaxdiagrams|requirements|toc|sitemap|keyword_index|"
                      r"fileio|capi3ref)\.html$")
    paths = sorted(p for p in glob.glob(f"{root}/**/*.html", recursive=True)
                   if not skip.match(os.path.basename(p)))
    return files_as_docs(paths, root, html_to_text)


def read_linux_doc():
    root = "/usr/share/doc/linux-doc-6.1/Documentation"
    paths = sorted(p for p in glob.glob(f"{root}/**/*.gz", recursive=True)
                   if "/translations/" not in p and "/devicetree/" not in p
                   and re.search(r"\.(rst|txt)\.gz$", p))
    return files_as_docs(paths, root)


def read_git_doc():
    root = "/usr/share/doc/git-doc"
    return files_as_docs(sorted(glob.glob(f"{root}/*.txt")), root)


def read_vim_doc():
    root = "/usr/share/vim/vim90/doc"
    return files_as_docs(sorted(glob.glob(f"{root}/*.txt")), root)


def read_debian_handbook():
    root = "/usr/share/doc/debian-handbook/html/en-US"
    units = [(page, html_to_text(read_text(os.path.join(root, page)) or ""))
             for page in html_reading_order(root)]
    return group_units(units, "")


def read_debian_reference():
    text = read_text("/usr/share/debian-reference/debian-reference.en.txt.gz")
    return chunk_text(text, "")


def read_django_doc():
    root = "/usr/share/doc/python-django-doc/html"
    skip = re.compile(r"^(_modules/|_static/|genindex|search|py-modindex|contents)")
    paths = sorted(p for p in glob.glob(f"{root}/**/*.html", recursive=True)
                   if not skip.match(os.path.relpath(p, root)))
    return files_as_docs(paths, root, html_to_text)


def read_sphinx_doc():
    root = "/usr/share/doc/sphinx-doc/html/_sources"
    return files_as_docs(sorted(glob.glob(f"{root}/**/*.rst.txt", recursive=True)), root)


def read_sqlalchemy_doc():
    root = "/usr/share/doc/python-sqlalchemy-doc/rst"
    return files_as_docs(sorted(glob.glob(f"{root}/**/*.rst", recursive=True)), root)


def read_go_doc():
    root = "/usr/share/doc/golang-1.19-doc/html"
    return files_as_docs(sorted(glob.glob(f"{root}/*.html")), root, html_to_text)


def read_go_src():
    root = "/usr/share/go-1.19/src"
    paths = sorted(p for p in glob.glob(f"{root}/**/*.go", recursive=True)
                   if os.path.isfile(p) and not p.endswith("_test.go")
                   and "/testdata/" not in p and "/vendor/" not in p)
    return files_as_docs(paths, root)


def read_debian_policy():
    root = "/usr/share/doc/debian-policy"
    paths = sorted(glob.glob(f"{root}/**/*.txt.gz", recursive=True))
    return files_as_docs(paths, root)


def read_developers_reference():
    root = "/usr/share/developers-reference/_sources"
    return files_as_docs(sorted(glob.glob(f"{root}/*.rst.txt")), root)


kSources = [
    Source("kjv-bible", ["bible-kjv-text", "bible-kjv"], "public domain (King James Version, 1611)",
           "the King James Bible, one document per book (short books joined in order)", read_kjv),
    Source("jargon-file", ["dict-jargon"], "public domain (Jargon File 4.4.7)",
           "the Jargon File lexicon, entries in order, joined into long documents", read_jargon),
    Source("python-doc", ["python3.11-doc"], "PSF-2.0",
           "Python 3.11 documentation, reStructuredText sources",
           read_python_doc),
    Source("perl-doc", ["perl-doc"], "GPL-1+ or Artistic",
           "Perl 5.36 core documentation (.pod)", read_perl_doc),
    Source("postgresql-doc", ["postgresql-doc-15"], "PostgreSQL (BSD-style)",
           "PostgreSQL 15 manual, HTML converted to text, pages joined in reading order",
           read_postgresql_doc),
    Source("sqlite-doc", ["sqlite3-doc"], "public domain",
           "SQLite documentation, HTML converted to text (short pages joined in name order)",
           read_sqlite_doc),
    Source("linux-doc", ["linux-doc-6.1"], "GPL-2 (per-file SPDX tags; some GPL-2+/CC-BY-4.0 "
           "or GFDL-1.1+ without invariant sections)",
           "Linux 6.1 kernel Documentation/ (.rst/.txt, no translations or devicetree)",
           read_linux_doc),
    Source("git-doc", ["git-doc"], "GPL-2",
           "Git documentation, AsciiDoc sources", read_git_doc),
    Source("vim-doc", ["vim-runtime"], "Vim license (GPL-compatible)",
           "Vim 9.0 help files", read_vim_doc),
    Source("debian-handbook", ["debian-handbook"], "GPL-2+ or CC-BY-SA-3.0",
           "The Debian Administrator's Handbook (en-US), HTML to text, in reading order",
           read_debian_handbook),
    Source("debian-reference", ["debian-reference-en"], "GPL-2+",
           "Debian Reference (English), plain-text edition, chapters in order",
           read_debian_reference),
    Source("python-stdlib", ["libpython3.11-minimal", "libpython3.11-stdlib"], "PSF-2.0",
           "Python 3.11 standard library source code (.py)",
           read_python_stdlib),
    Source("django-doc", ["python-django-doc"], "BSD-3-Clause",
           "Django 3.2 documentation, HTML converted to text", read_django_doc),
    Source("sphinx-doc", ["sphinx-doc"], "BSD-2-Clause",
           "Sphinx documentation, reStructuredText sources", read_sphinx_doc),
    Source("sqlalchemy-doc", ["python-sqlalchemy-doc"], "MIT (Expat)",
           "SQLAlchemy documentation, reStructuredText sources", read_sqlalchemy_doc),
    Source("go-doc", ["golang-1.19-doc"], "BSD-3-Clause (Go)",
           "The Go specification and memory model, HTML converted to text", read_go_doc),
    Source("go-src", ["golang-1.19-src"], "BSD-3-Clause (Go)",
           "Go 1.19 standard library source (.go, no tests), capped", read_go_src,
           max_chars=8_000_000),
    Source("debian-policy", ["debian-policy"], "GPL-2+",
           "Debian Policy Manual and related documents, plain-text editions",
           read_debian_policy),
    Source("developers-reference", ["developers-reference"], "GPL-2",
           "Debian Developer's Reference, reStructuredText sources", read_developers_reference),
]


def package_version(pkg):
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], check=True,
                              capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


# ---------------------------------------------------------------------------------------------

def split_key(seed, doc_id):
    return hashlib.sha256(f"{seed}:{doc_id}".encode()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".train/corpus")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--heldout-frac", type=float, default=0.03)
    ap.add_argument("--print-packages", action="store_true")
    args = ap.parse_args()

    if args.print_packages:
        print(" ".join(sorted({p for s in kSources for p in s.packages})))
        return

    missing = [p for s in kSources for p in s.packages if package_version(p) is None]
    if missing:
        sys.exit(f"build_corpus.py: missing Debian packages: {' '.join(missing)} "
                 f"(apt-get install -y {' '.join(missing)})")

    os.makedirs(args.out, exist_ok=True)
    seen_docs = set()
    seen_lines = set()
    summary = {"seed": args.seed, "heldout_frac": args.heldout_frac, "sources": []}
    n_written = 0
    with open(os.path.join(args.out, "docs.jsonl"), "w", encoding="utf-8") as out:
        for src in kSources:
            raw = src.reader()
            stats = collections.Counter()
            kept = []
            for doc_id, text in raw:
                text = clean_text(text)
                stats["read"] += 1
                if len(text) < kMinDocChars:
                    stats["short"] += 1
                    continue
                digest = hashlib.sha256(text.encode()).digest()
                if digest in seen_docs:
                    stats["duplicate"] += 1
                    continue
                long_lines = {hashlib.sha1(line.strip().encode()).digest()
                              for line in text.split("\n") if len(line.strip()) >= kDupLineChars}
                if long_lines and (len(long_lines & seen_lines) / len(long_lines)) > kDupLineFrac:
                    stats["near_duplicate"] += 1
                    continue
                seen_docs.add(digest)
                seen_lines |= long_lines
                kept.append((doc_id, text))
            if src.max_chars is not None and sum(len(t) for _, t in kept) > src.max_chars:
                capped, total = [], 0
                for doc_id, text in sorted(kept, key=lambda dt: split_key(args.seed, dt[0])):
                    if total + len(text) <= src.max_chars:
                        capped.append(doc_id)
                        total += len(text)
                capped = set(capped)
                stats["over_cap"] = len(kept) - len(capped)
                kept = [(d, t) for d, t in kept if d in capped]
            n_held = 0
            if len(kept) >= 4:
                n_held = max(1, round(args.heldout_frac * len(kept)))
            held = {d for d, _ in sorted(kept, key=lambda dt: split_key(args.seed, dt[0]))[:n_held]}
            chars = collections.Counter()
            docs = collections.Counter()
            for doc_id, text in kept:
                split = "heldout" if doc_id in held else "train"
                out.write(json.dumps({"id": f"{src.name}/{doc_id}", "source": src.name,
                                      "split": split, "text": text}, ensure_ascii=False) + "\n")
                chars[split] += len(text)
                docs[split] += 1
                n_written += 1
            entry = {"name": src.name, "description": src.description, "license": src.license,
                     "packages": {p: package_version(p) for p in src.packages},
                     "files_read": stats["read"], "too_short": stats["short"],
                     "duplicates": stats["duplicate"], "near_duplicates": stats["near_duplicate"],
                     "over_cap": stats["over_cap"],
                     "docs": dict(docs), "chars": dict(chars)}
            summary["sources"].append(entry)
            print(f"{src.name:18s} read {stats['read']:5d}  short {stats['short']:5d}  "
                  f"dup {stats['duplicate']:3d}  near-dup {stats['near_duplicate']:3d}  "
                  f"kept {len(kept):4d} ({docs['heldout']} held out)  "
                  f"{sum(chars.values()) / 1e6:6.2f}M chars", flush=True)
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    total = sum(sum(s["chars"].values()) for s in summary["sources"])
    print(f"{n_written} documents, {total / 1e6:.2f}M characters -> {args.out}/docs.jsonl")


if __name__ == "__main__":
    main()
