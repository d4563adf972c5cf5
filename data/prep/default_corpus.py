"""The default corpus, when no input is given: the King James Bible from the bible-kjv package (`bible`), one
document per book, and the fortunes of the fortunes package, one per fortune. Reads them (7 MB) into memory up
front; writes nothing.
"""

import os
import re
import shutil
import subprocess
import sys

from .errors import PrepareError
from .progress import format_bytes
from .readers import ITEM_TEXT, Source


FORTUNES_DIR = "/usr/share/games/fortunes"


_HEADING = re.compile(r"^(\S.*) (\d+)$")
_VERSE = re.compile(r"^\s+(\d+) (.*)$")


def bible_books(text):
    """One document per book of `bible gen1:1-rev22:21` output, one line per verse.

    The command prints a blank line, "Book N", a blank line, then verses as
    "  N text" wrapped at 80 columns with unindented continuation lines.
    """
    books, book, chapter = [], None, None
    previous_blank = True
    for line in text.splitlines():
        heading = _HEADING.match(line) if previous_blank else None
        previous_blank = not line.strip()
        if heading:
            if heading.group(1) != book:
                book = heading.group(1)
                books.append([])
            chapter = [line, ""]
            books[-1].append(chapter)
        elif chapter is None or not line.strip():
            continue
        elif _VERSE.match(line):
            chapter.append(" ".join(_VERSE.match(line).groups()))
        else:
            chapter[-1] += " " + line.strip()
    return ["\n\n".join("\n".join(ch) for ch in chapters) + "\n" for chapters in books]


_OVERSTRIKE = re.compile("[^\b]\b", re.DOTALL)


def strip_overstrike(text):
    """Drop the backspace overstrikes of terminal underline and bold ("_<BS>A", "A<BS>A", "__<BS><BS>AB")."""
    while True:
        plain = _OVERSTRIKE.sub("", text)
        if plain == text:
            return plain.replace("\b", "")
        text = plain


def fortune_documents(folder=FORTUNES_DIR):
    """One document per fortune, from the '%'-separated files that have a .dat index beside them."""
    docs = []
    if not os.path.isdir(folder):
        return docs
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if "." in name or os.path.islink(path) or not os.path.isfile(path + ".dat"):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = strip_overstrike(f.read())
        docs.extend(d for d in re.split(r"^%\n", text, flags=re.MULTILINE) if d.strip())
    return docs


def default_corpus_documents():
    bible = shutil.which("bible")
    if bible is None:
        raise PrepareError(
            "no input given, and the default corpus needs the `bible` command, which is missing\n"
            "  fix: apt-get install bible-kjv fortunes   (or pass your own text files or folders)")
    result = subprocess.run([bible, "gen1:1-rev22:21"], stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, check=False)
    books = bible_books(result.stdout)
    if result.returncode != 0 or len(books) != 66:
        raise PrepareError(
            f"`bible gen1:1-rev22:21` exited with {result.returncode} and gave {len(books)} books, not 66: "
            f"{result.stderr.strip()}\n  fix: apt-get install --reinstall bible-kjv")
    fortunes = fortune_documents()
    if not fortunes:
        print(f"note: no fortunes in {FORTUNES_DIR}; using the Bible only (apt-get install fortunes adds more)",
              file=sys.stderr)
    return books + fortunes


class DefaultCorpus(Source):
    """The default corpus (KJV Bible and fortunes), read into memory (7 MB) up front."""

    def __init__(self):
        self.docs = default_corpus_documents()
        self.total_bytes = sum(map(len, self.docs))
        self.read = 0

    def describe(self):
        return f"the default corpus (KJV Bible, fortunes), {format_bytes(self.total_bytes)}"

    def identity(self):
        return [["default corpus", len(self.docs), self.total_bytes]]

    def where(self, origin, line=True):
        return "the default corpus"

    def bytes_read(self):
        return self.read

    def events(self):
        for i, doc in enumerate(self.docs):
            self.read += len(doc)
            yield ITEM_TEXT, doc, (0, i)
