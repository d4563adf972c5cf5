"""The docs held to the code, where a machine can tell: every command-line flag that README.md and docs/*.md
name is one that some program of the repository defines (a string literal of its source), and every file of the
repository they name exists. A renamed flag or a moved file then fails here, not in a reader's shell."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
SOURCES = [p for ext in ("c", "cu", "h", "py", "sh") for p in glob.glob(os.path.join(ROOT, "**", f"*.{ext}"),
                                                                         recursive=True)
           if not re.search(r"/(third_party|\.venv|build|\.carry)/", p)]
# flags of other programs the docs show in their commands
FOREIGN = {"--np", "--host", "--bind-to", "--no-deps", "--only-binary", "--platform", "--python-version",
           "--implementation", "--target", "--no-index", "--no-compile", "--no-cache-dir", "--upgrade", "--dry-run",
           "--leak-check", "--error-exitcode", "--print-limit", "--tool", "--names", "--out", "--title", "--help",
           "--query-gpu",  # nvidia-smi's
           # llmq's, a peer's
           "--use-cuda-graphs", "--from-scratch", "--matmul-dtype", "--lmhead-chunks", "--debug-time-breakdown",
           "--model-dtype", "--opt-m-dtype", "--opt-v-dtype"}
# where the docs name outputs of a run, not files of the repository
GENERATED = ("data/shards", "log/", "runs/", "ckpt/", "checkpoints/", "third_party/", "build/")
BUILT = re.compile(r"^dev/cuda/([\w*]+_check|matmul_algos)$|^dev/bench/nccl_bench$")  # programs that `make` builds


def doc_text(path):
    return open(path, encoding="utf-8").read()


def source_text():
    return "\n".join(open(p, encoding="utf-8", errors="replace").read() for p in SOURCES)


def test_every_flag_the_docs_name_is_defined():
    src = source_text()
    missing = []
    for doc in DOCS:
        for flag in sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])", doc_text(doc)))):
            if flag in FOREIGN:
                continue
            if f'"{flag}"' not in src and f"'{flag}'" not in src:
                missing.append(f"{os.path.relpath(doc, ROOT)}: {flag}")
    assert not missing, "flags the docs name but no program defines:\n" + "\n".join(missing)


def test_every_repository_file_the_docs_name_exists():
    missing = []
    pattern = r"(?<![\w/.-])((?:llmc|tests|scripts|dev|docs|data|reference|testdata)/[\w./*{},-]*[\w*}])"
    for doc in DOCS:
        for path in sorted(set(re.findall(pattern, doc_text(doc)))):
            if path.startswith(GENERATED) or BUILT.match(path):
                continue
            if any(c in path for c in "*{"):  # a glob: some file must match it
                expanded = re.sub(r"\{[^}]*\}", "*", path)
                if not glob.glob(os.path.join(ROOT, expanded)):
                    missing.append(f"{os.path.relpath(doc, ROOT)}: {path} (no file matches)")
                continue
            if not os.path.exists(os.path.join(ROOT, path)):
                missing.append(f"{os.path.relpath(doc, ROOT)}: {path}")
    assert not missing, "files the docs name that the repository does not hold:\n" + "\n".join(missing)
