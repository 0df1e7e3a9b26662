"""What the tutorial and the docs say a reader can follow: they name no material that is not
shipped, and the tutorial's index lists its chapters as they are.

attnkit started from a handful of study notes that are not part of the project. A page
that says "seed 003 does X" sends the reader to something they cannot open, so the docs
describe each mistake by its pattern ("a softmax that exponentiates before subtracting the
row max") and link the peers readers use (d2l, the Annotated Transformer) instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEARN = ROOT / "docs" / "learn"
TEXT_SUFFIXES = {".md", ".py", ".ipynb", ".txt", ".rst", ".html", ".toml", ".cfg"}

# Each pattern names something a reader cannot look up: a note by its number ("seed 003",
# "Seeds 000 and 004", "seed-style"), or the folder the notes live in outside the project.
UNSHIPPED = re.compile(
    r"(?<!-)\bseeds?\s+0\d{2}\b"    # seed 003, Seeds 001, 002 and 004 (not --seed 000)
    r"|\bseed[- ]style\b"           # "seed-style tril"
    r"|\bseeds/"                    # a path into the notes' folder
    r"|\.\./shared\b|/work/shared\b",  # the folder beside the repository
    re.IGNORECASE,
)


def shipped_text_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for top in ("docs", "src"):
        files += sorted(p for p in (ROOT / top).rglob("*")
                        if p.is_file() and p.suffix in TEXT_SUFFIXES)
    return files


def test_the_scan_sees_the_tutorial_and_the_package():
    names = {p.relative_to(ROOT).as_posix() for p in shipped_text_files()}
    assert "docs/learn/01-softmax.md" in names and "docs/check.md" in names
    assert "src/attnkit/check/multihead/check.py" in names, sorted(names)[:20]


@pytest.mark.parametrize("text, hit", [
    ("**Seed 001** computes `np.exp(x)`", "Seed 001"),
    ("Seeds 000 and 004 fill with -1e9", "Seeds 000"),
    ("with `j <= i` (seed-style `torch.tril`)", "seed-style"),
    ("see ../shared/seeds/003.txt", "../shared"),
])
def test_the_pattern_catches_what_it_is_for(text, hit):
    found = UNSHIPPED.search(text)
    assert found is not None and found.group(0).lower() == hit.lower()


@pytest.mark.parametrize("text", [
    "torch.manual_seed(0)", "rng = np.random.default_rng(3)", "seed 0", "the same seed gives "
    "d2l's weights", "600 steps, batch 64, seed 0, 1 thread", "--seed 000",
])
def test_the_pattern_leaves_random_seeds_alone(text):
    assert UNSHIPPED.search(text) is None, text


def test_nothing_shipped_names_unshipped_material():
    hits = []
    for path in shipped_text_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found = UNSHIPPED.search(line)
            if found:
                where = f"{path.relative_to(ROOT)}:{number}"
                hits.append(f"{where}: {found.group(0)!r}: {line.strip()}")
    assert not hits, ("these lines name material a reader cannot open; describe the mistake "
                      "by its pattern instead:\n" + "\n".join(hits))


def chapters() -> list[Path]:
    return sorted(LEARN.glob("[0-9][0-9]-*.md"))


def test_the_index_lists_every_chapter_in_order_starting_from_zero():
    index = (LEARN / "README.md").read_text(encoding="utf-8")
    linked = re.findall(r"^\| \[(\d+)\. [^\]]+\]\((\d\d-[\w-]+\.md)\)", index, re.MULTILINE)
    assert [name for _, name in linked] == [c.name for c in chapters()], linked
    assert [int(n) for n, _ in linked] == list(range(len(chapters()))), linked
    assert "Start here" in index and "(00-start-here.md)" in index


def test_every_chapter_links_the_next_one():
    names = [c.name for c in chapters()]
    for this, following in zip(names, names[1:]):
        text = (LEARN / this).read_text(encoding="utf-8")
        assert f"]({following})" in text, f"{this} does not link to {following}"


def test_the_readme_counts_the_chapters_right():
    words = {8: "eight", 9: "nine", 10: "ten", 11: "eleven", 12: "twelve"}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    count = len(chapters())
    said = re.search(r"\b(\w+) short chapters\b", readme)
    assert said is not None, "README.md no longer says how many chapters the tutorial has"
    assert said.group(1) == words.get(count, str(count)), (said.group(0), count)
