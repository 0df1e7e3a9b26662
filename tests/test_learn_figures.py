"""The tutorial's figures (docs/learn/img/): every image that docs/learn and the README show
is made by docs/learn/make_figures.py, is committed, and the script still runs.

Figures are looked at by a person before they are committed; these tests keep the chain
from the script to the page intact, so a figure can always be remade.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEARN = ROOT / "docs" / "learn"
SCRIPT = LEARN / "make_figures.py"
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.png)\)")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def generated() -> set[str]:
    """File names the script registers (``@figure("NAME.png")``), read without importing it."""
    return set(re.findall(r'@figure\("([^"]+\.png)"\)', SCRIPT.read_text(encoding="utf-8")))


def shown() -> dict[str, list[str]]:
    """``{image file name: [pages]}`` for every docs/learn/img image a page embeds."""
    pages = [ROOT / "README.md", *sorted(LEARN.glob("*.md"))]
    found: dict[str, list[str]] = {}
    for page in pages:
        for target in IMAGE.findall(page.read_text(encoding="utf-8")):
            path = (page.parent / target).resolve()
            if path.parent == (LEARN / "img").resolve():
                found.setdefault(path.name, []).append(page.relative_to(ROOT).as_posix())
    return found


def test_every_shown_image_is_generated_and_committed():
    images = shown()
    assert len(images) >= 9, images  # the README's and one per chapter
    missing_script = sorted(set(images) - generated())
    assert not missing_script, f"shown but not made by {SCRIPT.name}: {missing_script}"
    missing_file = sorted(n for n in images if not (LEARN / "img" / n).is_file())
    assert not missing_file, f"shown but not committed under docs/learn/img: {missing_file}"


def test_every_generated_image_is_shown():
    orphans = sorted(generated() - set(shown()))
    assert not orphans, f"made by {SCRIPT.name} but shown on no page: {orphans}"


def test_every_chapter_shows_a_figure_and_ends_with_the_notes_mistakes():
    chapters = sorted(LEARN.glob("[0-9][0-9]-*.md"))
    assert len(chapters) == 10, [c.name for c in chapters]  # 0 (start here) to 9
    for chapter in chapters:
        text = chapter.read_text(encoding="utf-8")
        assert IMAGE.search(text), f"{chapter.name} shows no figure"
        assert "## Mistakes in the notes" in text, f"{chapter.name} names no mistakes"
        assert "```python" in text, f"{chapter.name} has no runnable block"


needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                      reason="the figures need matplotlib (attnkit[viz])")
# "wrote PATH (990 px wide, smallest text 12.1 px on the page)", one line per figure
WROTE = re.compile(r"^wrote (\S+) \((\d+) px wide, smallest text ([\d.]+) px on the page\)$",
                   re.MULTILINE)
PAGE_PX, MIN_TEXT_PX = 980, 9.0  # a page column; the smallest readable text there


def load_script():
    spec = importlib.util.spec_from_file_location("attnkit_make_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(
    any(importlib.util.find_spec(p) is None for p in ("matplotlib", "torch")),
    reason="the figures need matplotlib and torch (attnkit[torch,viz])",
)
def test_script_makes_every_figure_readable_on_a_page(tmp_path):
    """Every figure is made, and its smallest text is at least 9 px high once the page has
    scaled the image to its 980 px column (7-pt text on a 1375 px figure is 7.6 px)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    env["ATTNKIT_LEARN_QUICK"] = "1"  # 09_gpt.png from a tiny GPT, not the chapter's 3-min run
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for name in generated():
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, (name, len(data))
    sizes = {Path(path).name: (int(w), float(px)) for path, w, px in WROTE.findall(proc.stdout)}
    assert set(sizes) == generated(), proc.stdout
    import matplotlib.image as mpimg

    for name, (width, px) in sizes.items():
        assert mpimg.imread(tmp_path / name).shape[1] == width, name  # the width it reported
        assert px >= MIN_TEXT_PX, f"{name}: smallest text {px} px on a {PAGE_PX} px page"


@needs_matplotlib
def test_text_on_page_measures_what_a_reader_sees(tmp_path):
    """The measure itself: 7-pt text is 10.7 px at 110 dpi; on a 1375 px figure the page
    shrinks it to 7.6 px, and the script refuses to write such a figure."""
    from matplotlib.figure import Figure

    script = load_script()
    assert (script.DPI, script.PAGE_PX, script.MIN_TEXT_PX) == (110, PAGE_PX, MIN_TEXT_PX)

    def figure(width_in, points):
        fig = Figure(figsize=(width_in, 3))
        ax = fig.subplots()
        ax.tick_params(labelsize=12)
        ax.set_title("big title", fontsize=14)
        ax.text(0.5, 0.5, "small note", fontsize=points)
        return fig

    width, px, text = script.text_on_page(figure(12.5, 7))
    assert (width, text) == (1375, "small note")
    assert px == pytest.approx(7 * 110 / 72 * 980 / 1375) and px < MIN_TEXT_PX
    width, px, _ = script.text_on_page(figure(8, 7))  # narrower than the page: not scaled
    assert width == 880 and px == pytest.approx(7 * 110 / 72)
    script.FIGURES["too_small.png"] = lambda: figure(12.5, 7)
    with pytest.raises(SystemExit, match="too_small.png.*7.6 px"):
        script.main(["--out", str(tmp_path), "--only", "too_small"])
    assert not (tmp_path / "too_small.png").exists()
