"""Chapter 9's last exercise trains a GPT of the reader's blocks, and only once
``check_block`` passes them: run its cell with the solution's block in the stub's place
(tests/learn/test_exercises.py grades it; this runs what follows the grade)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1].parent
CHAPTER = ROOT / "docs" / "learn" / "09-build-a-gpt.md"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


exercises = _load("attnkit_test_exercises_09", ROOT / "tests" / "learn" / "test_exercises.py")
solutions = _load("attnkit_solutions_09", ROOT / "docs" / "learn" / "solutions" / "ch09.py")
wrong = _load("attnkit_wrong_09", ROOT / "tests" / "learn" / "wrong_answers" / "ch09.py")


def _run_with(block_class, monkeypatch) -> str:
    """The exercise cell, its ``Block`` replaced by ``block_class``; what it printed."""
    monkeypatch.setenv("ATTNKIT_LEARN_QUICK", "1")
    (code,) = [c for _, c in exercises._exercise_blocks(CHAPTER) if "class Block" in c]
    head, tail = code.split("\nreport = ", 1)
    ns: dict = {"__name__": "exercise"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(head, "exercise", "exec"), ns)
        ns["Block"] = block_class
        exec(compile("report = " + tail, "exercise", "exec"), ns)
    return out.getvalue()


def test_the_solution_trains_and_samples(monkeypatch):
    printed = _run_with(solutions.Block, monkeypatch)
    assert "OK" in printed and "loss " in printed, printed
    first, last = (float(v) for v in printed.split("loss ")[1].split()[:3:2])
    assert last < first, printed


def test_a_post_norm_block_does_not_train(monkeypatch):
    printed = _run_with(wrong.BlockPostNorm, monkeypatch)
    assert "post-norm" in printed and "loss " not in printed, printed
