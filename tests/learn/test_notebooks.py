"""The tutorial's notebooks (docs/learn/**/NN-*.ipynb): one per chapter, whose cells are
exactly what tools/notebooks.py makes from the chapter's markdown now (the same code as the
markdown blocks that tests/test_docs.py runs), committed with the outputs of a run without
an error (every figure and the explorer shown under their cells), and each runs top to
bottom in a real Jupyter kernel (nbclient, ipykernel on this interpreter) with no error and
writes nothing outside its scratch folder ``attnkit-out/``.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LEARN = ROOT / "docs" / "learn"
FIX = "python tools/notebooks.py {folder}"
SCRATCH = "attnkit-out"  # where the chapters' cells write files (git ignores it)
# A call that makes a figure: the cell must show it (end the block with the figure).
FIGURE_CALL = re.compile(r"\b(plot_attention|show_heatmaps)\(")

for _tool in ("jupytext", "nbformat", "nbclient", "ipykernel"):
    if importlib.util.find_spec(_tool) is None:
        pytest.skip(f"the notebook tests need {_tool} (the dev extra)", allow_module_level=True)

import nbformat  # noqa: E402


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


notebooks = _load("attnkit_tools_notebooks", ROOT / "tools" / "notebooks.py")
test_docs = _load("attnkit_test_docs_blocks", ROOT / "tests" / "test_docs.py")

FOLDERS = notebooks.chapter_folders(LEARN)
CHAPTERS = [c for folder in FOLDERS for c in notebooks.chapters(folder)]


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_chapters_were_found():
    assert LEARN in FOLDERS and len(notebooks.chapters(LEARN)) >= 8, [rel(c) for c in CHAPTERS]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=rel)
def test_notebook_is_committed_and_up_to_date(chapter):
    path = notebooks.notebook_path(chapter)
    fix = FIX.format(folder=rel(chapter.parent))
    assert path.is_file(), f"{rel(chapter)} has no notebook {path.name}: run `{fix}`"
    text = path.read_text(encoding="utf-8")
    assert notebooks.cells_only(text) == notebooks.render(chapter), (
        f"{rel(path)}'s cells are not what {rel(chapter)} makes now (edited by hand, or the "
        f"chapter changed since): run `{fix}` and commit the notebook")
    assert notebooks.ran(text), (f"{rel(path)} has no outputs of a full run without an "
                                 f"error: run `{fix}` and commit the notebook")


def test_no_notebook_without_its_chapter():
    orphans = [rel(nb) for folder in FOLDERS for nb in folder.glob("[0-9][0-9]-*.ipynb")
               if not nb.with_suffix(".md").is_file()]
    assert not orphans, f"notebooks whose chapter is gone (delete them): {orphans}"


def _shows(cell, mime: str) -> list[str]:
    return [o["data"][mime] for o in cell.outputs
            if o.output_type in ("execute_result", "display_data") and mime in o["data"]]


def _check_outputs(chapter: Path, nb) -> None:
    """What a reader must see under the cells of a run of ``chapter``'s notebook: the
    setup cell's version line, every figure a cell makes, the explorer, no error."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not [o for c in code for o in c.outputs if o.output_type == "error"], rel(chapter)
    setup = "".join(o.get("text", "") for o in code[0].outputs)
    assert setup.startswith("attnkit "), (rel(chapter), setup[:200])
    for cell in code[1:]:
        if FIGURE_CALL.search(cell.source):
            assert _shows(cell, "image/png"), (
                f"{rel(chapter)}: a cell makes a figure but shows none; end the block with "
                f"the figure so a notebook displays it:\n{cell.source[:300]}")
        if "explore(" in cell.source:  # the explorer in place (its _repr_html_: an iframe)
            assert any('class="attnkit-explorer"' in h for h in _shows(cell, "text/html")), (
                f"{rel(chapter)}: a cell calls explore(...) but shows no explorer; end the "
                f"block with the explorer object so a notebook displays it")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=rel)
def test_notebook_code_is_the_chapters_blocks(chapter):
    """The code cells after the setup cell are the ```python blocks test_docs.py runs, in
    order, and the committed notebook shows what a run shows (figures and explorer too)."""
    nb = nbformat.read(notebooks.notebook_path(chapter), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and code[0].source.startswith("# Setup: makes attnkit importable")
    blocks = [block for _, block in test_docs.python_blocks(chapter)]
    assert [c.source.strip() for c in code[1:]] == [b.strip() for b in blocks]
    _check_outputs(chapter, nb)
    for cell in nb.cells:  # images keep their paths relative to the chapter's folder
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", cell.source):
            assert (chapter.parent / target).is_file(), (rel(chapter), target)


def test_make_notebook_writes_what_the_chapter_holds(tmp_path):
    """The tool on a chapter of its own: prose -> markdown cells, blocks -> code cells."""
    (tmp_path / "01-tiny.md").write_text(
        "# Tiny\n\nSome prose.\n\n```python\nx = 1\nprint(x + 1)\n```\n\n"
        "![a figure](img/a.png)\n\n```console\n$ make test\n```\n", encoding="utf-8")
    (tmp_path / "notes.md").write_text("not a chapter\n", encoding="utf-8")
    assert notebooks.main(["--no-execute", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.ipynb")) == ["01-tiny.ipynb"]
    nb = json.loads((tmp_path / "01-tiny.ipynb").read_text(encoding="utf-8"))
    kinds = [(c["cell_type"], "".join(c["source"])) for c in nb["cells"]]
    assert kinds[1] == ("markdown", "# Tiny\n\nSome prose.")
    assert kinds[2] == ("code", "x = 1\nprint(x + 1)")
    assert "![a figure](img/a.png)" in kinds[3][1] and kinds[3][0] == "markdown"
    assert "make test" in "".join(src for kind, src in kinds if kind == "markdown")
    assert notebooks.main(["--check", str(tmp_path)]) == 1  # never run: no outputs
    (tmp_path / "01-tiny.md").write_text("# Tiny\n\n```python\nx = 2\n```\n", encoding="utf-8")
    assert notebooks.stale(tmp_path) == [tmp_path / "01-tiny.ipynb"]  # the cells changed
    # A ```sh block would become a %%sh cell that runs when the notebook runs: refused.
    (tmp_path / "02-shell.md").write_text("```python\nx = 1\n```\n\n```sh\nrm -rf build\n```\n",
                                          encoding="utf-8")
    with pytest.raises(ValueError, match=r"02-shell\.md.*%%sh.*```console"):
        notebooks.make_notebook(tmp_path / "02-shell.md")


@pytest.mark.timeout(300)
def test_the_tool_stores_the_outputs_of_a_run_elsewhere(tmp_path):
    """`make notebooks` runs each notebook and keeps its outputs (and nothing a run adds
    besides: no timings), in a scratch folder: a file a cell writes does not land beside
    the chapter."""
    (tmp_path / "01-tiny.md").write_text(
        "# Tiny\n\n```python\nprint(6 * 7)\nopen('left-behind.txt', 'w').close()\n```\n\n"
        "```python\n6 * 7\n```\n", encoding="utf-8")
    assert notebooks.main([str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["01-tiny.ipynb", "01-tiny.md"]
    text = (tmp_path / "01-tiny.ipynb").read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == [1, 2, 3]
    assert code[1].outputs[0]["text"] == "42\n"
    assert code[2].outputs[0]["data"]["text/plain"] == "42"
    assert all(c.metadata == {} for c in nb.cells), [c.metadata for c in nb.cells]
    assert notebooks.ran(text) and notebooks.main(["--check", str(tmp_path)]) == 0


def test_the_scratch_folder_is_ignored_by_git():
    """What the chapters' cells write (attnkit-out/ beside the notebook) never shows in
    `git status`."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git clone")
    for folder in FOLDERS:
        path = rel(folder / SCRATCH / "heads.png")
        proc = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
        assert proc.returncode == 0, f"{path} is not ignored by git: add {SCRATCH}/ to .gitignore"


# -- running them --------------------------------------------------------------------------
def _kernel_env() -> dict[str, str]:
    env = notebooks.kernel_env()
    env["MPLBACKEND"] = "Agg"  # a figure shows only if it shows itself (no inline backend)
    env["ATTNKIT_LEARN_QUICK"] = "1"  # as in test_docs.py: chapter 9 trains a tiny GPT here
    return env


def _needs(chapter: Path) -> list[str]:
    code = "\n".join(block for _, block in test_docs.python_blocks(chapter))
    return test_docs.missing_packages(code)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("chapter", CHAPTERS, ids=rel)
def test_notebook_runs_top_to_bottom(chapter, tmp_path):
    from nbclient.exceptions import CellExecutionError

    missing = _needs(chapter)
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (an attnkit extra) installed")
    nb = nbformat.read(notebooks.notebook_path(chapter), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import sys\nprint(sys.executable)"))
    # A scratch folder standing for the chapter's (its images linked in), as `make
    # notebooks` runs it: whatever a cell writes must go to attnkit-out/ there.
    work = tmp_path / "work"
    start = time.perf_counter()
    try:
        ran = notebooks.execute(nb, chapter.parent, work, env=_kernel_env())
    except CellExecutionError as err:
        pytest.fail(f"{rel(notebooks.notebook_path(chapter))} failed "
                    f"(the cell is a block of {rel(chapter)}):\n{err}", pytrace=False)
    seconds = time.perf_counter() - start
    print(f"{rel(chapter)}: {seconds:.1f} s")

    kernel_python = ran.cells[-1].outputs[0]["text"].strip()
    assert Path(kernel_python).resolve() == Path(sys.executable).resolve(), kernel_python
    ran.cells.pop()
    _check_outputs(chapter, ran)
    left = sorted(p.name for p in work.iterdir() if p.name not in ("img", SCRATCH))
    assert not left, (f"{rel(chapter)}: cells wrote {left} beside the notebook; write into "
                      f"{SCRATCH}/ (git ignores it) so `git status` stays clean")
    # The grading cells print attnkit check's report in the notebook's language: the
    # Chinese notebooks set ATTNKIT_LANG in their setup cell (the code is the English code).
    header = "attnkit 检查" if chapter.parent.name == "zh" else "attnkit check"
    for cell in ran.cells:
        if cell.cell_type == "code" and "print(report)" in cell.source:
            text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            assert header in text, f"{rel(chapter)}: a grading cell printed {text[:200]!r}"
