"""Code, tests and docs name the source documents by what they are ("the MI355 megakernel
PR", "the ragged-decode contract"), never by file id nor as "the seed('s)", and carry no "issue N" notes: only
`docs/seeds.md` maps names to files, and `docs/results/` are historical records."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHERE_NOT_WHAT = re.compile(r"\b00[024]_[0-9a-f]{6,}|\bseed 00[024]\b|\bissue #?\d+\b"
                            # "the seed" for a source document: which one? (an RNG's seed is never possessive)
                            r"|\bthe seed's\b|\bthe seeds?\s+(?:found|judges?|says?|ran|wrote)\b"
                            r"|\bfrom the seeds\b",
                            re.IGNORECASE)
EXEMPT = ("docs/results/", "docs/seeds.md", "tests/test_names_say_what.py")


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / p for p in out.stdout.split("\0") if p and not p.startswith(EXEMPT)]


def test_no_seed_file_ids_or_issue_numbers_outside_the_seed_map():
    found = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if WHERE_NOT_WHAT.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "name documents by what they are (docs/seeds.md):\n" + "\n".join(found)


def test_the_seed_map_names_every_source_document():
    text = (ROOT / "docs" / "seeds.md").read_text(encoding="utf-8")
    for name in ("the MI355 megakernel PR", "the MoE barrier report", "the faithful per-task gate recipe",
                 "the ragged-decode contract"):
        assert name in text
    for file_id in ("002_79daa8f540f6a64d.txt", "000_d0657c503f61c22a.txt", "004_7857eeb99bc0f1cf.txt"):
        assert file_id in text


def test_gpu_scripts_are_named_by_what_they_do():
    # not by the helper or round that wrote them ("f-gates.sh", "n-layers2.sh", "o-mma2.sh")
    names = [p.name for p in (ROOT / "ci" / "gpu").iterdir() if p.is_file()]
    by_who = [n for n in names if re.match(r"^[a-z][-_]", n) or re.search(r"[a-z]\d\.\w+$", n)]
    assert not by_who, by_who


def test_module_docstrings_are_a_summary_line_and_at_most_a_paragraph():
    # one line for the job, then at most a paragraph; longer notes belong to the docs page that
    # owns the topic (its "In the code" section)
    import ast

    long = []
    for path in [*ROOT.glob("hazards/**/*.py"), *ROOT.glob("stress/**/*.py")]:
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=True)
        paragraphs = [p for p in re.split(r"\n\s*\n", doc or "") if p.strip()]
        if len(paragraphs) > 2 or (paragraphs and "\n" in paragraphs[0]):
            long.append(str(path.relative_to(ROOT)))
    assert long == []
