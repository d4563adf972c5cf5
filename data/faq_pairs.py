#!/usr/bin/env python3
"""Question/answer pairs from the Python FAQ in Debian's python3-doc, as JSON lines for
`data/prepare.py --format pairs`: the fine-tuning recipe's data (README, "Fine-tuning").

    python3 data/faq_pairs.py > data/faq.jsonl          # needs: apt-get install python3-doc
    python3 data/faq_pairs.py some/sphinx/faq/*.html    # other Sphinx HTML pages

Every section heading that ends with '?' is a question; the text under it up to the next
heading is the answer (paragraphs and list items joined by blank lines, code blocks kept
line by line, at most --max-chars characters, cut at a paragraph's end). Each line is
{"prompt": "Q: Question?\\nA:", "completion": " Answer\\n"}: the "A:" marks where an answer
starts, so a sample prompted with "Q: ...?\\nA:" answers (a bare question ending in a newline
looked like the end of an answer, which EOS follows, to a model fine-tuned for 150 steps: it
answered with EOS alone). Questions without an answer text are skipped and counted on stderr.
"""

import argparse
import glob
import html.parser
import json
import re
import sys

DEFAULT_PAGES = "/usr/share/doc/python3-doc/html/faq/*.html"
HEADINGS = ("h1", "h2", "h3", "h4")
BLOCKS = ("p", "li", "pre", "dt", "dd")  # elements whose text makes one paragraph of an answer


class FaqParser(html.parser.HTMLParser):
    """Collects (heading, [paragraphs]) for every heading of a Sphinx page, in order."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.sections = []  # [heading text, [paragraph texts]]
        self.heading = None  # the heading's text parts while inside one
        self.block = None  # the current paragraph's text parts
        self.block_depth = 0
        self.pre = 0
        self.skip = 0  # inside a headerlink anchor (its text is the pilcrow)

    def handle_starttag(self, tag, attrs):
        cls = dict(attrs).get("class") or ""
        if tag == "a" and "headerlink" in cls:
            self.skip += 1
        elif tag in HEADINGS:
            self.heading = []
        elif tag in BLOCKS and self.sections:
            if self.block_depth == 0:
                self.block = []
            self.block_depth += 1
            self.pre += tag == "pre"

    def handle_endtag(self, tag):
        if tag == "a" and self.skip:
            self.skip -= 1
        elif tag in HEADINGS and self.heading is not None:
            self.sections.append([" ".join("".join(self.heading).split()), []])
            self.heading = None
        elif tag in BLOCKS and self.block_depth:
            self.pre -= tag == "pre"
            self.block_depth -= 1
            if self.block_depth == 0:
                text = "".join(self.block)
                text = text.strip("\n") if tag == "pre" else " ".join(text.split())
                if text:
                    self.sections[-1][1].append(text)
                self.block = None

    def handle_data(self, data):
        if self.skip:
            return
        if self.heading is not None:
            self.heading.append(data)
        elif self.block is not None:
            self.block.append(data)


def answer_text(paragraphs, max_chars):
    """The paragraphs joined by blank lines, whole paragraphs only, up to max_chars (at least the first, cut)."""
    out = []
    size = 0
    for p in paragraphs:
        if out and size + 2 + len(p) > max_chars:
            break
        out.append(p)
        size += len(p) + (2 if len(out) > 1 else 0)
    text = "\n\n".join(out)
    return text[:max_chars]


def pairs_from_page(text, max_chars):
    """(pairs, skipped): every question heading with its answer."""
    parser = FaqParser()
    parser.feed(text)
    parser.close()
    pairs, skipped = [], 0
    for heading, paragraphs in parser.sections:
        if not heading.endswith("?"):
            continue
        answer = answer_text(paragraphs, max_chars)
        if not answer.strip():
            skipped += 1
            continue
        pairs.append({"prompt": "Q: " + heading + "\nA:", "completion": " " + answer + "\n"})
    return pairs, skipped


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pages", nargs="*", help="Sphinx HTML pages (default: %s)" % DEFAULT_PAGES)
    p.add_argument("--max-chars", type=int, default=1500, help="longest answer in characters (default 1500)")
    args = p.parse_args(argv)
    if args.max_chars < 1:
        print("error: --max-chars must be at least 1", file=sys.stderr)
        return 2
    pages = args.pages or sorted(glob.glob(DEFAULT_PAGES))
    if not pages:
        print("error: no pages: %s is missing; install Debian's python3-doc (apt-get install python3-doc) or name "
              "Sphinx HTML pages" % DEFAULT_PAGES, file=sys.stderr)
        return 1
    total, skipped_total = 0, 0
    for page in pages:
        try:
            with open(page, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            print("error: cannot read %s: %s" % (page, e.strerror), file=sys.stderr)
            return 1
        pairs, skipped = pairs_from_page(text, args.max_chars)
        for pair in pairs:
            sys.stdout.write(json.dumps(pair, ensure_ascii=False) + "\n")
        total += len(pairs)
        skipped_total += skipped
    print("faq_pairs: %d question/answer pairs from %d pages (%d questions without an answer skipped)"
          % (total, len(pages), skipped_total), file=sys.stderr)
    if total == 0:
        print("error: no question headings (ending with '?') with answers in these pages", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
