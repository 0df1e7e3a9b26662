"""The Chinese tutorial (docs/learn/zh/) mirrors the English one (docs/learn/).

Every English chapter has a Chinese chapter of the same file name, with the same fenced code
blocks in the same order (byte for byte, comments included), so one set of figures and
solutions serves both; its prose is written in Chinese; its links lead to the Chinese
chapters, to files that exist, and to the same figures as the English chapter.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EN = ROOT / "docs" / "learn"
ZH = EN / "zh"

CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
LATIN = re.compile(r"[A-Za-z]")
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
IMAGE_TARGET = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.png)\)")
CHAPTER = re.compile(r"^\d\d-[\w-]+\.md$")
# Chinese prose carries English terms in parentheses (softmax, KV cache, SDPA, ...). At
# least this share of its letters must be Chinese characters; English prose has none.
MIN_CJK_SHARE = 0.6


def chapters(folder: Path) -> list[Path]:
    return sorted(folder.glob("[0-9][0-9]-*.md"))


def fenced_blocks(text: str) -> list[str]:
    """Every fenced block (its fences and info string included), in order."""
    blocks: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if current is None:
            if line.startswith("```"):
                current = [line]
        else:
            current.append(line)
            if line.strip() == "```":
                blocks.append("\n".join(current))
                current = None
    assert current is None, f"a fenced block is never closed: {current[0]!r}"
    return blocks


def prose(text: str) -> str:
    """The text a reader reads as sentences: no code, math, link targets or inline code."""
    text = re.sub(r"^```.*?^```[ \t]*$", " ", text, flags=re.MULTILINE | re.DOTALL)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.DOTALL)
    text = re.sub(r"\$[^$\n]+\$", " ", text)
    text = re.sub(r"`[^`\n]+`", " ", text)
    text = LINK.sub(r"\2", text)                 # a link or image keeps its words only
    return re.sub(r"https?://\S+", " ", text)


def cjk_share(text: str) -> float:
    cjk, latin = len(CJK.findall(text)), len(LATIN.findall(text))
    return cjk / max(cjk + latin, 1)


EN_CHAPTERS = [p.name for p in chapters(EN)]


def test_the_tutorial_has_chapters_to_mirror():
    assert len(EN_CHAPTERS) >= 9 and EN_CHAPTERS[0] == "00-start-here.md", EN_CHAPTERS


def test_every_english_chapter_has_a_chinese_one_and_no_more():
    zh = [p.name for p in chapters(ZH)]
    assert zh == EN_CHAPTERS, (f"missing in docs/learn/zh: {sorted(set(EN_CHAPTERS) - set(zh))}; "
                               f"without an English chapter: {sorted(set(zh) - set(EN_CHAPTERS))}")


@pytest.mark.parametrize("name", EN_CHAPTERS)
def test_code_blocks_are_the_english_ones_in_the_same_order(name):
    zh_path = ZH / name
    if not zh_path.is_file():
        pytest.fail(f"docs/learn/zh/{name} is missing")
    en = fenced_blocks((EN / name).read_text(encoding="utf-8"))
    zh = fenced_blocks(zh_path.read_text(encoding="utf-8"))
    if en == zh:
        return
    diff = difflib.unified_diff("\n\n".join(en).splitlines(), "\n\n".join(zh).splitlines(),
                                f"docs/learn/{name}", f"docs/learn/zh/{name}", lineterm="", n=2)
    pytest.fail(f"{len(en)} English blocks, {len(zh)} Chinese; the code differs "
                "(copy the English blocks, in order):\n" + "\n".join(diff))


@pytest.mark.parametrize("name", EN_CHAPTERS)
def test_the_prose_is_chinese(name):
    zh_path = ZH / name
    if not zh_path.is_file():
        pytest.fail(f"docs/learn/zh/{name} is missing")
    share = cjk_share(prose(zh_path.read_text(encoding="utf-8")))
    assert share >= MIN_CJK_SHARE, (f"docs/learn/zh/{name}: {share:.0%} of the prose's letters "
                                    f"are Chinese characters (need {MIN_CJK_SHARE:.0%})")


def test_the_measure_tells_english_from_chinese():
    """English chapters score 0; a sentence with a few English terms still scores high."""
    for name in EN_CHAPTERS:
        assert cjk_share(prose((EN / name).read_text(encoding="utf-8"))) < 0.05, name
    mixed = "softmax 沿每一行计算：权重的第 `i` 行表示查询如何分配注意力（KV cache）。"
    assert cjk_share(prose(mixed)) > MIN_CJK_SHARE
    assert prose("看 `np.exp(x)` 和 [d2l](https://d2l.ai)").split() == ["看", "和", "d2l"]


@pytest.mark.parametrize("name", EN_CHAPTERS)
def test_links_lead_to_chinese_chapters_and_existing_files(name):
    zh_path = ZH / name
    if not zh_path.is_file():
        pytest.fail(f"docs/learn/zh/{name} is missing")
    bad = []
    for _, _, target in LINK.findall(zh_path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", target) or target.startswith("#"):
            continue
        path = (ZH / target.split("#")[0]).resolve()
        if not path.exists():
            bad.append(f"{target}: no such file")
        elif CHAPTER.match(path.name) and path.parent != ZH.resolve():
            bad.append(f"{target}: an English chapter; link the Chinese one")
    assert not bad, f"docs/learn/zh/{name}:\n" + "\n".join(bad)


@pytest.mark.parametrize("name", EN_CHAPTERS)
def test_figures_are_the_english_chapters_figures(name):
    zh_path = ZH / name
    if not zh_path.is_file():
        pytest.fail(f"docs/learn/zh/{name} is missing")

    def figures(page: Path) -> list[Path]:
        text = page.read_text(encoding="utf-8")
        return [(page.parent / t).resolve() for t in IMAGE_TARGET.findall(text)]

    en = figures(EN / name)
    assert en and figures(zh_path) == en, (name, en, figures(zh_path))
    for image in en:
        assert image.is_file(), image


def test_each_chinese_chapter_links_the_next_one():
    for this, following in zip(EN_CHAPTERS, EN_CHAPTERS[1:]):
        if (ZH / this).is_file():
            text = (ZH / this).read_text(encoding="utf-8")
            assert f"]({following})" in text, f"docs/learn/zh/{this} does not link {following}"


def test_the_chinese_index_links_every_chapter_in_order_and_the_english_one():
    index = (ZH / "README.md").read_text(encoding="utf-8")
    linked = [t for _, _, t in LINK.findall(index) if CHAPTER.match(t)]
    assert list(dict.fromkeys(linked)) == EN_CHAPTERS, linked
    assert "(../README.md)" in index, "the Chinese index does not link the English course"
    assert cjk_share(prose(index)) >= MIN_CJK_SHARE


def test_the_readme_links_both_courses():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/learn/README.md)" in readme
    assert "[中文版](docs/learn/zh/README.md)" in readme


@pytest.mark.parametrize("name", EN_CHAPTERS)
def test_sections_mirror_the_english_chapter(name):
    """As many sections as the English chapter, and its notes' mistakes and exercises too."""
    zh_path = ZH / name
    if not zh_path.is_file():
        pytest.fail(f"docs/learn/zh/{name} is missing")
    en, zh = (EN / name).read_text(encoding="utf-8"), zh_path.read_text(encoding="utf-8")

    def sections(text: str) -> list[str]:
        return re.findall(r"^## .*$", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S), re.M)

    assert len(sections(zh)) == len(sections(en)), (sections(en), sections(zh))
    for english, chinese in (("## Mistakes in the notes", "## 笔记里的常见错误"),
                             ("## Exercises", "## 练习")):
        assert (english in en) == (chinese in zh), f"docs/learn/zh/{name}: {chinese!r}"
