"""Every ```python block in README.md and docs/ runs as written.

Each block runs alone, in a fresh interpreter (its own namespace, its own environment
variables, its own process group), in a temporary working folder, so a block can neither
lean on another nor leave files behind. The tutorial's chapters (docs/learn/NN-*.md) are
the exception in one respect: their blocks share one interpreter per chapter, each still
in a fresh namespace, a fresh working folder and the chapter's starting environment, so a
block still cannot use another's names or files; only imports are paid once (about two
minutes of this suite on 2 cores), as in the chapter's notebook, which runs them in one
kernel (tests/learn/test_notebooks.py). A block that needs an extra that is not
installed is skipped with the extra's name; with every extra (``make test``) none is
skipped. Failures are reported as ``path:line`` of the block's opening fence.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")
FENCE = re.compile(r"^```python[ \t]*$")

# Modules a block may import -> what must be installed for it to run.
NEEDS = {
    "attnkit.torch": ("torch",),
    "attnkit.distributed": ("torch",),
    "attnkit.triton": ("torch", "triton"),
    "attnkit.viz": ("matplotlib",),
    "torch": ("torch",),
    "triton": ("triton",),
    "matplotlib": ("matplotlib",),
    "attnkit.integrations.transformers": ("torch", "transformers"),
    "transformers": ("transformers",),
}
IMPORT = re.compile(r"^\s*(?:import|from)\s+([\w.]+)", re.MULTILINE)


def doc_files() -> list[Path]:
    pages = sorted((ROOT / "docs").glob("**/*.md"))
    return [ROOT / "README.md", *(page for page in pages if not repeats_english_code(page))]


def repeats_english_code(page: Path) -> bool:
    """True for a page of the Chinese course whose every block is its English chapter's.

    docs/learn/zh/ repeats the English chapters' code byte for byte, in the same order
    (tests/learn/test_zh.py fails otherwise), so running those blocks again would only
    double the tutorial's share of this suite (about two minutes on 2 cores). A zh page with
    a block the English chapter lacks is run like any other page.
    """
    zh = ROOT / "docs" / "learn" / "zh"
    if zh not in page.parents:
        return False
    english = sorted((ROOT / "docs" / "learn").glob(f"{page.name[:2]}-*.md"))
    if not page.name[:2].isdigit() or len(english) != 1:
        return False
    theirs = {code for _, code in python_blocks(english[0])}
    return all(code in theirs for _, code in python_blocks(page))


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line of the opening fence, code)`` for every ```python block of ``path``."""
    blocks: list[tuple[int, str]] = []
    start, body = None, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if start is None:
            if FENCE.match(line):
                start, body = number, []
        elif line.strip() == "```":
            blocks.append((start, "\n".join(body) + "\n"))
            start = None
        else:
            body.append(line)
    if start is not None:
        raise AssertionError(f"{path.relative_to(ROOT)}:{start}: ```python block never closed")
    return blocks


# The reference page of the checker's codes: two short programs per code, run as a
# chapter (one interpreter), each block skipped alone when it needs a missing extra.
CODES_PAGE = ROOT / "docs" / "check-codes.md"


def is_chapter(path: Path) -> bool:
    """A chapter of the English tutorial (or the codes' page), whose blocks run in one
    interpreter."""
    return path == CODES_PAGE or (path.parent == ROOT / "docs" / "learn"
                                  and path.name[:2].isdigit())


CASES = [
    pytest.param(code, id=f"{path.relative_to(ROOT).as_posix()}:{line}")
    for path in doc_files() if not is_chapter(path)
    for line, code in python_blocks(path)
]
CHAPTERS = [
    pytest.param(path, id=f"{path.relative_to(ROOT).as_posix()}:all")
    for path in doc_files() if is_chapter(path)
]

# Runs the blocks of one chapter, each in a fresh namespace and working folder, with the
# environment it started with; stops at the first that fails, naming its path:line.
CHAPTER_RUNNER = """\
import json, os, sys, tempfile, traceback
blocks = json.load(open(sys.argv[1], encoding="utf-8"))
start_env, start_dir = dict(os.environ), os.getcwd()
for where, code in blocks:
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        try:
            exec(compile(code, where, "exec"), {"__name__": "__main__"})
        except SystemExit as stop:
            if stop.code not in (None, 0):
                sys.exit(f"{where}: the block exited with {stop.code!r}")
        except BaseException:
            traceback.print_exc()
            sys.exit(f"{where}: the block failed")
        finally:
            os.chdir(start_dir)
            os.environ.clear()
            os.environ.update(start_env)
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
"""


def missing_packages(code: str) -> list[str]:
    needed: set[str] = set()
    for module in IMPORT.findall(code):
        for prefix, packages in NEEDS.items():
            if module == prefix or module.startswith(prefix + "."):
                needed.update(packages)
    return sorted(p for p in needed if importlib.util.find_spec(p) is None)


def test_blocks_were_found():
    """The collection itself works: every page with an example yields its blocks."""
    pages = {case.id.rsplit(":", 1)[0] for case in CASES + CHAPTERS}
    expected = {"README.md", "docs/distributed.md", "docs/numpy-gradients.md",
                "docs/torch.md", "docs/triton.md", "docs/viz.md",
                *(f"docs/learn/{p.name}" for p in (ROOT / "docs/learn").glob("0*.md"))}
    assert len(expected) >= 15, sorted(expected)  # the tutorial's 9 chapters are collected
    assert expected <= pages, sorted(expected - pages)
    assert len(CASES) >= 9, [case.id for case in CASES]


def _block_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    # A block decides for itself whether Triton runs interpreted; the suite's own setting
    # (tests/conftest.py turns the interpreter on without a GPU) must not decide for it.
    env.pop("TRITON_INTERPRET", None)
    # Chapter 9 trains a GPT for minutes; here a tiny one for a few steps (its notebook's
    # stored outputs are the full run).
    env["ATTNKIT_LEARN_QUICK"] = "1"
    return env


@pytest.mark.parametrize("code", CASES)
def test_doc_block_runs(code, tmp_path):
    missing = missing_packages(code)
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (an attnkit extra) installed")
    script = tmp_path / "block.py"
    script.write_text(code, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_block_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"the block failed:\n{code}\n--- stderr ---\n{proc.stderr}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_blocks_run(chapter, tmp_path):
    blocks = [(f"{chapter.relative_to(ROOT).as_posix()}:{line}", code)
              for line, code in python_blocks(chapter)]
    if chapter == CODES_PAGE:  # independent programs: run those whose extras are here
        blocks = [(where, code) for where, code in blocks if not missing_packages(code)]
    missing = missing_packages("\n".join(code for _, code in blocks))
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (an attnkit extra) installed")
    (tmp_path / "blocks.json").write_text(json.dumps(blocks), encoding="utf-8")
    (tmp_path / "run.py").write_text(CHAPTER_RUNNER, encoding="utf-8")
    proc = subprocess.run([sys.executable, "run.py", "blocks.json"], cwd=tmp_path,
                          env=_block_env(), capture_output=True, text=True,
                          timeout=60 + 60 * len(blocks))
    assert proc.returncode == 0, f"{proc.stderr[-6000:]}"
