"""data/faq_pairs.py: question/answer pairs from Sphinx FAQ pages (the fine-tuning recipe's data)."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "data"))
import faq_pairs  # noqa: E402

PAGE = """<html><body><div class="sphinxsidebar"><h3>Navigation</h3><p>not an answer</p></div>
<section id="faq"><h1>Programming FAQ<a class="headerlink" href="#faq">\u00b6</a></h1>
<section id="q1"><h3>How do I <em>loop</em>?<a class="headerlink" href="#q1">\u00b6</a></h3>
<p>Use a <code>for</code>
   statement.</p>
<div class="highlight"><pre>for i in range(3):
    print(i)
</pre></div>
<ul><li><p>Or a while loop.</p></li></ul>
</section>
<section id="q2"><h3>Why is this empty?<a class="headerlink" href="#q2">\u00b6</a></h3></section>
<section id="q3"><h2>General notes</h2><p>Not a question.</p></section>
<section id="q4"><h3>What &amp; why?</h3><p>First paragraph.</p><p>Second paragraph, long enough to cut.</p>
</section></section></body></html>"""


def test_pairs_from_a_page():
    pairs, skipped = faq_pairs.pairs_from_page(PAGE, 1000)
    assert skipped == 1  # "Why is this empty?"
    assert [p["prompt"] for p in pairs] == ["Q: How do I loop?\nA:", "Q: What & why?\nA:"]
    first = pairs[0]["completion"]
    # paragraphs joined by blank lines, whitespace of prose collapsed, code kept line by line, no pilcrow
    assert first == " Use a for statement.\n\nfor i in range(3):\n    print(i)\n\nOr a while loop.\n"
    assert "\u00b6" not in json.dumps(pairs)


def test_max_chars_keeps_whole_paragraphs():
    pairs, _ = faq_pairs.pairs_from_page(PAGE, 20)
    assert pairs[1]["completion"] == " First paragraph.\n"
    pairs, _ = faq_pairs.pairs_from_page(PAGE, 5)  # a first paragraph longer than the limit is cut
    assert pairs[1]["completion"] == " First\n"


def run(*args):
    return subprocess.run([sys.executable, os.path.join(REPO, "data", "faq_pairs.py"), *args], capture_output=True,
                          text=True)


def test_command_line(tmp_path):
    page = tmp_path / "faq.html"
    page.write_text(PAGE, encoding="utf-8")
    r = run(str(page))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    assert len(lines) == 2 and set(lines[0]) == {"prompt", "completion"}
    assert "2 question/answer pairs from 1 pages (1 questions without an answer skipped)" in r.stderr


def test_errors(tmp_path):
    r = run(str(tmp_path / "missing.html"))
    assert r.returncode == 1 and "cannot read" in r.stderr and "Traceback" not in r.stderr
    empty = tmp_path / "empty.html"
    empty.write_text("<html><h2>No questions here</h2></html>", encoding="utf-8")
    r = run(str(empty))
    assert r.returncode == 1 and "no question headings" in r.stderr
    r = run("--max-chars", "0", str(empty))
    assert r.returncode == 2 and "--max-chars" in r.stderr
