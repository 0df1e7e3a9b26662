"""The tutorial's notebooks (docs/learn/**/NN-*.ipynb): one per chapter, exactly what
tools/notebooks.py makes from the chapter's markdown now, with the same code as the
markdown blocks that tests/test_docs.py runs, and each runs top to bottom in a real
Jupyter kernel (nbclient, ipykernel on this interpreter) with no error.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LEARN = ROOT / "docs" / "learn"
FIX = "python tools/notebooks.py {folder}"
CELL_TIMEOUT_S = 120  # one cell; the slowest (training in chapter 8) takes about a second

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
    assert path.read_text(encoding="utf-8") == notebooks.render(chapter), (
        f"{rel(path)} is not what {rel(chapter)} makes now (edited by hand, or the chapter "
        f"changed since): run `{fix}` and commit the notebook")


def test_no_notebook_without_its_chapter():
    orphans = [rel(nb) for folder in FOLDERS for nb in folder.glob("[0-9][0-9]-*.ipynb")
               if not nb.with_suffix(".md").is_file()]
    assert not orphans, f"notebooks whose chapter is gone (delete them): {orphans}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=rel)
def test_notebook_code_is_the_chapters_blocks(chapter):
    """The code cells after the setup cell are the ```python blocks test_docs.py runs, in
    order, and the committed notebook carries no outputs."""
    nb = nbformat.read(notebooks.notebook_path(chapter), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and code[0].source.startswith("# Setup: makes attnkit importable")
    blocks = [block for _, block in test_docs.python_blocks(chapter)]
    assert [c.source.strip() for c in code[1:]] == [b.strip() for b in blocks]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    for cell in nb.cells:  # images keep their paths relative to the chapter's folder
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", cell.source):
            assert (chapter.parent / target).is_file(), (rel(chapter), target)


def test_make_notebook_writes_what_the_chapter_holds(tmp_path):
    """The tool on a chapter of its own: prose -> markdown cells, blocks -> code cells."""
    (tmp_path / "01-tiny.md").write_text(
        "# Tiny\n\nSome prose.\n\n```python\nx = 1\nprint(x + 1)\n```\n\n"
        "![a figure](img/a.png)\n\n```console\n$ make test\n```\n", encoding="utf-8")
    (tmp_path / "notes.md").write_text("not a chapter\n", encoding="utf-8")
    assert notebooks.main([str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.ipynb")) == ["01-tiny.ipynb"]
    nb = json.loads((tmp_path / "01-tiny.ipynb").read_text(encoding="utf-8"))
    kinds = [(c["cell_type"], "".join(c["source"])) for c in nb["cells"]]
    assert kinds[1] == ("markdown", "# Tiny\n\nSome prose.")
    assert kinds[2] == ("code", "x = 1\nprint(x + 1)")
    assert "![a figure](img/a.png)" in kinds[3][1] and kinds[3][0] == "markdown"
    assert "make test" in "".join(src for kind, src in kinds if kind == "markdown")
    assert notebooks.main(["--check", str(tmp_path)]) == 0
    (tmp_path / "01-tiny.md").write_text("# Tiny\n\n```python\nx = 2\n```\n", encoding="utf-8")
    assert notebooks.main(["--check", str(tmp_path)]) == 1  # stale now
    # A ```sh block would become a %%sh cell that runs when the notebook runs: refused.
    (tmp_path / "02-shell.md").write_text("```python\nx = 1\n```\n\n```sh\nrm -rf build\n```\n",
                                          encoding="utf-8")
    with pytest.raises(ValueError, match=r"02-shell\.md.*%%sh.*```console"):
        notebooks.make_notebook(tmp_path / "02-shell.md")


# -- running them --------------------------------------------------------------------------
def _kernel_manager(tmp_path: Path):
    """A kernel on this very interpreter: a kernelspec of our own naming sys.executable, so
    no python3 spec installed elsewhere on the machine can be picked instead."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec_dir = tmp_path / "kernels" / "attnkit-tests"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "attnkit tests", "language": "python"}), encoding="utf-8")
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    return KernelManager(kernel_name="attnkit-tests", kernel_spec_manager=ksm)


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH"))
                                        if p)
    env["MPLBACKEND"] = "Agg"
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # debugpy's note about frozen modules
    env.pop("TRITON_INTERPRET", None)  # as in test_docs.py: a cell decides for itself
    env["ATTNKIT_LEARN_QUICK"] = "1"  # as in test_docs.py: chapter 9 trains a tiny GPT
    return env


def _needs(chapter: Path) -> list[str]:
    code = "\n".join(block for _, block in test_docs.python_blocks(chapter))
    return test_docs.missing_packages(code)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("chapter", CHAPTERS, ids=rel)
def test_notebook_runs_top_to_bottom(chapter, tmp_path):
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    missing = _needs(chapter)
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (an attnkit extra) installed")
    nb = nbformat.read(notebooks.notebook_path(chapter), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import sys\nprint(sys.executable)"))
    # A copy of the chapter's folder (the notebook, its images): cells that save a figure
    # or a page write there, not into docs/learn.
    work = tmp_path / "work"
    work.mkdir()
    img = chapter.parent / "img"
    if img.is_dir():
        (work / "img").symlink_to(img, target_is_directory=True)
    client = NotebookClient(copy.deepcopy(nb), timeout=CELL_TIMEOUT_S, startup_timeout=120,
                            km=_kernel_manager(tmp_path),
                            resources={"metadata": {"path": str(work)}})
    start = time.perf_counter()
    try:
        ran = client.execute(env=_kernel_env())
    except CellExecutionError as err:
        pytest.fail(f"{rel(notebooks.notebook_path(chapter))} failed "
                    f"(the cell is a block of {rel(chapter)}):\n{err}", pytrace=False)
    finally:
        if client.km.has_kernel:  # the client does not own a manager it was given
            client.km.shutdown_kernel(now=True)
    seconds = time.perf_counter() - start
    print(f"{rel(chapter)}: {seconds:.1f} s")

    outputs = [o for c in ran.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    kernel_python = ran.cells[-1].outputs[0]["text"].strip()
    assert Path(kernel_python).resolve() == Path(sys.executable).resolve(), kernel_python
    # A cell that ends with explore(...) shows the explorer in place (its _repr_html_).
    explorer_cells = [c for c in ran.cells if c.cell_type == "code" and "explore(" in c.source]
    for cell in explorer_cells:
        html = [o["data"].get("text/html", "") for o in cell.outputs
                if o.output_type == "execute_result"]
        assert any('class="attnkit-explorer"' in h for h in html), (
            f"{rel(chapter)}: a cell calls explore(...) but shows no explorer; end the block "
            f"with the explorer object so a notebook displays it")
    # The grading cells print attnkit check's report in the notebook's language: the
    # Chinese notebooks set ATTNKIT_LANG in their setup cell (the code is the English code).
    header = "attnkit 检查" if chapter.parent.name == "zh" else "attnkit check"
    for cell in ran.cells:
        if cell.cell_type == "code" and "print(report)" in cell.source:
            text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            assert header in text, f"{rel(chapter)}: a grading cell printed {text[:200]!r}"
