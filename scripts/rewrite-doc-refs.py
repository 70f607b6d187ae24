#!/usr/bin/env python3
"""Keeps every citation of a documentation page pointing into docs/.

Comments and docs cite sections of pages such as `models.md §1.3` or `serving.md §5.2`. This script
rewrites every such citation in the tree to the page under docs/ ("models.md §1.3" becomes
"docs/models.md §1.3"), and `--check` proves that every citation lands on a docs/ file and a section
heading that exists in it, and that nothing names documentation outside the repository.

  scripts/rewrite-doc-refs.py            rewrite in place, print one line per changed file and a count
  scripts/rewrite-doc-refs.py --dry-run  the same count, nothing written
  scripts/rewrite-doc-refs.py --check    exit 1 listing every citation that does not resolve

Rewriting is idempotent: a citation that already starts with docs/ is left alone. Inside docs/ a bare
page name ("models.md §2") resolves to the sibling page and is left alone too.

A bare section sign ("§2.5") in a file resolves against the docs/ pages that file cites (or, inside
docs/, against the page itself), so a header comment naming the page covers the file's later
references. Section numbers of RFCs, Unicode and other outside standards are not checked.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCAN_DIRS = ["src", "tests", "python", "bench", "fuzz", "scripts", "cmake", "docs", "tools"]
SCAN_FILES = ["README.md", "Makefile", "CMakeLists.txt"]
SKIP_DIRS = {"node_modules", ".git", "__pycache__", ".pytest_cache"}
SKIP_SUFFIXES = {".safetensors", ".npy", ".bin", ".model", ".jsonl", ".png", ".gz", ".zst"}
THIS_FILE = Path(__file__).resolve()

PAGES = ["models", "formats", "serving", "parallel", "performance", "style", "architecture", "vision",
         "README"]
# The architecture overview was once the README of the design pages.
RENAMED = {"README": "architecture"}
# The practices of style.md were items 1-20 of its section 2; docs/style.md numbers them §1-§20.
STYLE_ITEM = re.compile(r"^2\.(\d+)$")

SEC = r"\d+(?:\.\d+)*(?:[a-z](?![\w-]))?"
# A line break inside a section title, with the comment leader of the next line.
WRAP_IN_QUOTE = r"\n[ \t]*(?://+|#+|\*)?[ \t]*"
# A line break inside a citation, with the comment leader of the next line.
WRAP = r"(?:[ \t]*\n[ \t]*(?://+|#+|\*|;+)?[ \t]*|[ \t]?)"
CITATION = re.compile(
    r"(?<![\w./-])"
    r"(?P<prefix>(?:\.\./)?shared/design/|/work/shared/design/|design/|docs/)?"
    r"(?P<page>" + "|".join(PAGES) + r")\.md"
    r"(?P<tick>`?)"
    r"(?P<secs>" + WRAP + r"§[ \t]?" + SEC +
    r"(?:(?:[ \t]?[-–][ \t]?|,[ \t]?|[ \t](?:and|or|\+)[ \t])(?:§[ \t]?)?" + SEC + r")*)?"
    r"(?P<quoted>,?[ \t]\"(?:[^\"\n]|" + WRAP_IN_QUOTE + r"){2,80}\"|,?[ \t]'[^'\n]{2,60}')?")
DESIGN_README = re.compile(r"\bdesign README\b")
# Working notes of earlier issues, never part of the repository; their numerics policies are in docs/models.md.
NOTES = re.compile(r"(?<![\w./-])notes/issue(\d+)\.md")
NOTES_TARGET = {"3": "docs/models.md §0", "4": "docs/models.md §0, §4.1"}
SEC_NUMBER = re.compile(SEC)
BARE_SECTION = re.compile(r"§[ \t]?(" + SEC + r")")
OUTSIDE_STANDARD = re.compile(r"(RFC[ \t]?\d+|Unicode|ISO|IEEE|ECMA|C\+\+\d*|POSIX|standard)[ \t,]*$")
FORBIDDEN = [
    (re.compile(r"\.\./shared\b"), "../shared"),
    (re.compile(r"/work/shared\b"), "/work/shared"),
    (re.compile(r"(?<![\w-])shared/design\b|(?<![\w./-])design/(?=\w)"), "design/ page"),
    (re.compile(r"(?<![\w./-])notes/\w"), "notes/ (working notes outside the repository)"),
    (re.compile(r"\bthe design\b|\bdesign(?:'s)? (?:page|pages|README|doc|docs)\b", re.I), "the design"),
]
HEADING = re.compile(r"^#{1,6}[ \t]+(.*)$")
HEADING_NUMBER = re.compile(r"^(?:§[ \t]?)?(" + SEC + r")(?:[.)]|[ \t]|$)")


def scanned_files() -> list[Path]:
    files = [ROOT / name for name in SCAN_FILES if (ROOT / name).is_file()]
    for top in SCAN_DIRS:
        for dirpath, dirnames, filenames in os.walk(ROOT / top):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build"))
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if path.suffix not in SKIP_SUFFIXES and path.resolve() != THIS_FILE:
                    files.append(path)
    return files


def read_text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def in_docs(path: Path) -> bool:
    return path.resolve().parent == (ROOT / "docs").resolve()


def target_page(m: re.Match) -> str:
    page = m.group("page")
    if page == "README" and not is_design_readme(m):
        return "README"
    return RENAMED.get(page, page)


def quoted_title(m: re.Match) -> str:
    """The section title quoted after a citation, with a line break and comment leader undone."""
    return " ".join(re.sub(WRAP_IN_QUOTE, " ", m.group("quoted") or "").split()).strip(" ,\"'")


def is_design_readme(m: re.Match) -> bool:
    """README.md means the repository's own README unless it names a design path or a section the
    README does not have but the architecture page does."""
    if m.group("prefix") in ("design/", "shared/design/", "../shared/design/", "/work/shared/design/"):
        return True
    quoted = quoted_title(m)
    return bool(quoted) and quoted.lower() in headings_of("docs/architecture.md")[1] and \
        quoted.lower() not in headings_of("README.md")[1]


def rewrite_match(m: re.Match, path: Path) -> str:
    page = target_page(m)
    prefix = m.group("prefix")
    if page == "README":
        return m.group(0)
    if prefix == "docs/" and page == m.group("page"):
        return m.group(0)
    new_prefix = "" if in_docs(path) else "docs/"
    secs = m.group("secs") or ""
    if page == "style" and secs:
        secs = re.sub(SEC, lambda s: STYLE_ITEM.sub(r"\1", s.group(0)), secs)
    return f"{new_prefix}{page}.md{m.group('tick')}{secs}{m.group('quoted') or ''}"


def rewrite_text(text: str, path: Path) -> tuple[str, int]:
    count = 0

    def one(m: re.Match) -> str:
        nonlocal count
        new = rewrite_match(m, path)
        count += new != m.group(0)
        return new

    text = CITATION.sub(one, text)
    text, n = DESIGN_README.subn("docs/architecture.md", text)
    text, n_notes = NOTES.subn(lambda m: NOTES_TARGET.get(m.group(1), "docs/models.md"), text)
    return text, count + n + n_notes


_heading_cache: dict[str, tuple[set[str], set[str]]] = {}


def headings_of(rel: str) -> tuple[set[str], set[str]]:
    """(section numbers, lowercased heading texts) of a page, both empty if it does not exist."""
    if rel not in _heading_cache:
        numbers: set[str] = set()
        titles: set[str] = set()
        text = read_text(ROOT / rel) if (ROOT / rel).is_file() else None
        in_fence = False
        for line in (text or "").splitlines():
            if line.startswith("```"):
                in_fence = not in_fence
            m = None if in_fence else HEADING.match(line)
            if not m:
                continue
            title = m.group(1).strip()
            n = HEADING_NUMBER.match(title)
            if n:
                numbers.add(n.group(1))
                title = title[n.end():].strip()
            titles.add(title.lower().strip("`"))
            titles.add(m.group(1).strip().lower())
        _heading_cache[rel] = (numbers, titles)
    return _heading_cache[rel]


def title_exists(rel: str, quoted: str) -> bool:
    q = quoted.lower()
    return any(q in t for t in headings_of(rel)[1])


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def check_file(path: Path, text: str) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    problems: list[str] = []
    cited: list[str] = [rel] if in_docs(path) else []
    spans: list[tuple[int, int]] = []
    for m in CITATION.finditer(text):
        spans.append(m.span())
        where = f"{rel}:{line_of(text, m.start())}: {' '.join(m.group(0).split())}"
        page = m.group("page")
        prefix = m.group("prefix")
        if page == "README" and prefix is None:
            target = "README.md"
        elif prefix == "docs/" or (prefix is None and in_docs(path)):
            target = f"docs/{page}.md"
        else:
            problems.append(f"{where}: points outside docs/ (run scripts/rewrite-doc-refs.py)")
            continue
        if not (ROOT / target).is_file():
            problems.append(f"{where}: {target} does not exist")
            continue
        cited.append(target)
        numbers, _ = headings_of(target)
        for sec in SEC_NUMBER.findall(m.group("secs") or ""):
            if sec not in numbers:
                problems.append(f"{where}: {target} has no section §{sec}")
        quoted = quoted_title(m)
        if quoted and not title_exists(target, quoted):
            problems.append(f"{where}: {target} has no heading \"{quoted}\"")
    for m in BARE_SECTION.finditer(text):
        if any(a <= m.start() < b for a, b in spans):
            continue
        if OUTSIDE_STANDARD.search(text[max(0, m.start() - 24):m.start()]):
            continue
        sec = m.group(1)
        docs_cited = [t for t in cited if t.startswith("docs/")]
        if not any(sec in headings_of(t)[0] for t in docs_cited):
            pages = ", ".join(sorted(set(docs_cited))) or "no docs/ page cited in this file"
            problems.append(f"{rel}:{line_of(text, m.start())}: bare §{sec} is a section of none of: {pages}")
    for pattern, what in FORBIDDEN:
        for m in pattern.finditer(text):
            problems.append(f"{rel}:{line_of(text, m.start())}: mentions {what}: "
                            f"{' '.join(text[max(0, m.start() - 30):m.end() + 30].split())}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="list citations that do not resolve; exit 1 if any")
    mode.add_argument("--dry-run", action="store_true", help="count the rewrites without writing")
    args = parser.parse_args()

    files = [(p, t) for p in scanned_files() if (t := read_text(p)) is not None]
    if args.check:
        problems = [msg for p, t in files for msg in check_file(p, t)]
        for msg in problems:
            print(msg)
        print(f"{len(problems)} unresolved citation(s) in {len(files)} files", file=sys.stderr)
        return 1 if problems else 0

    total = 0
    for path, text in files:
        new, count = rewrite_text(text, path)
        if count:
            total += count
            print(f"{path.relative_to(ROOT).as_posix()}: {count}")
            if not args.dry_run:
                path.write_text(new, encoding="utf-8")
    print(f"{total} citation(s) {'to rewrite' if args.dry_run else 'rewritten'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
