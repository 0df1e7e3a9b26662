"""The exercises at the end of each chapter of docs/learn, graded as a reader would be.

Each exercise is one ```python block under a chapter's ``## Exercises``: a stub, then a
grading line (``report = check_...(...)``, or ``max_error = ...`` where no check applies).
For every block this test

1. runs it as written: the stub must run and be graded wrong (a stub the check passes
   teaches nothing);
2. puts the reference solution (``docs/learn/solutions/chNN.py``, same name) in the stub's
   place and grades again: no finding at all;
3. does the same with each recorded wrong answer (``tests/learn/wrong_answers/chNN.py``,
   at least three per exercise): the report must hold the finding code that names the
   mistake, and that finding's diagnosis must point at the line to fix (a pattern per
   answer, ``DIAGNOSIS`` in the same file), in the English report and the Chinese one.

So the grading line the reader runs is the one tested, and a change to the checker that
stops naming a mistake fails here.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import io
import re
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
LEARN = ROOT / "docs" / "learn"
FENCE = re.compile(r"^```python[ \t]*$")
GRADE = re.compile(r"^(report|max_error) = ")


@functools.cache
def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_learn_{path.parent.name}_{path.stem}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _chapters() -> list[tuple[str, Path]]:
    return [(f"ch{p.name[:2]}", p) for p in sorted(LEARN.glob("0*.md"))]


def _exercise_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of every ```python block after the page's ``## Exercises``."""
    blocks, start, body, seen = [], None, [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip() == "## Exercises":
            seen = True
        elif not seen:
            continue
        elif start is None and FENCE.match(line):
            start, body = number, []
        elif start is not None and line.strip() == "```":
            blocks.append((start, "\n".join(body) + "\n"))
            start = None
        elif start is not None:
            body.append(line)
    return blocks


class Exercise:
    """One exercise block: the name the reader defines, and how it is graded."""

    def __init__(self, chapter: str, path: Path, line: int, code: str) -> None:
        self.chapter, self.where, self.code = chapter, f"{path.name}:{line}", code
        self.solutions = _load(LEARN / "solutions" / f"{chapter}.py")
        tree = ast.parse(code)
        defined = [n.name for n in tree.body
                   if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        names = [n for n in defined if hasattr(self.solutions, n)]
        assert len(names) == 1, (f"{self.where}: the block should define exactly one name "
                                 f"that solutions/{chapter}.py defines; found {names}")
        self.name = names[0]
        grading = [ast.get_source_segment(code, n) for n in tree.body
                   if isinstance(n, ast.Assign) and GRADE.match(ast.unparse(n))]
        assert len(grading) == 1, f"{self.where}: one grading statement expected: {grading}"
        self.grading = grading[0]

    def run(self, answer: Any = None) -> Any:
        """Run the block (its stub, or ``answer`` in the stub's place); return what its
        grading line computed."""
        ns: dict[str, Any] = {"__name__": "exercise"}
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(compile(self.code, self.where, "exec"), ns)
            if answer is not None:
                ns[self.name] = answer
                exec(compile(self.grading, self.where, "exec"), ns)
        return ns["report"] if "report" in ns else ns["max_error"]


EXERCISES = [Exercise(chapter, path, line, code)
             for chapter, path in _chapters() for line, code in _exercise_blocks(path)]
BY_NAME = {(e.chapter, e.name): e for e in EXERCISES}


def _answers(listing: str) -> list:
    """``(chapter, exercise name, answer, code)`` of every entry of ``listing`` (``WRONG``)
    in tests/learn/wrong_answers/chNN.py: every recorded mistake is named by its code."""
    params = []
    for chapter, _ in _chapters():
        path = ROOT / "tests" / "learn" / "wrong_answers" / f"{chapter}.py"
        for name, answer, code in getattr(_load(path), listing, []) if path.exists() else []:
            params.append(pytest.param(chapter, name, answer, code,
                                       id=f"{chapter}-{name}-{answer.__name__}"))
    return params


def _diagnoses() -> list:
    """``(chapter, exercise name, answer, code, pattern)`` for every recorded wrong answer
    graded by ``attnkit check``: ``pattern`` (from ``DIAGNOSIS``) names the line to fix."""
    params = []
    for param in _answers("WRONG"):
        chapter, name, answer, code = param.values
        if code == "mismatch":
            continue
        path = ROOT / "tests" / "learn" / "wrong_answers" / f"{chapter}.py"
        pattern = getattr(_load(path), "DIAGNOSIS", {}).get(answer.__name__)
        params.append(pytest.param(chapter, name, answer, code, pattern, id=param.id))
    return params


CJK = re.compile(r"[\u4e00-\u9fff]")


def _is_wrong(result: Any) -> bool:
    return not result < 1e-5 if isinstance(result, float) else not result.ok  # NaN: wrong


def test_every_chapter_has_exercises():
    chapters = {chapter for chapter, _ in _chapters()}
    with_exercises = {e.chapter for e in EXERCISES}
    assert chapters == with_exercises, sorted(chapters - with_exercises)
    for chapter in chapters:
        n = sum(e.chapter == chapter for e in EXERCISES)
        assert 2 <= n <= 4, (chapter, n)


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.where for e in EXERCISES])
def test_stub_runs_and_is_graded_wrong(exercise):
    result = exercise.run()
    assert _is_wrong(result), f"{exercise.where}: the stub passes its own grading"


@pytest.mark.parametrize("exercise", EXERCISES, ids=[e.where for e in EXERCISES])
def test_solution_passes(exercise):
    result = exercise.run(getattr(exercise.solutions, exercise.name))
    if isinstance(result, float):
        assert result < 1e-5, f"{exercise.where}: solution off by {result}"
    else:
        assert result.ok and result.findings == [], f"{exercise.where}:\n{result}"


@functools.cache
def _graded(chapter: str, name: str, answer: Any) -> Any:
    """The grade of one recorded wrong answer, computed once for the tests that read it."""
    return BY_NAME[(chapter, name)].run(answer)


@pytest.mark.parametrize("chapter, name, answer, code", _answers("WRONG"))
def test_wrong_answer_gets_its_finding(chapter, name, answer, code):
    exercise = BY_NAME[(chapter, name)]
    result = _graded(chapter, name, answer)
    if code == "mismatch":  # graded by comparison, not by attnkit check
        assert isinstance(result, float) and not result < 1e-5, result  # NaN is wrong too
        return
    assert code in result.codes, f"{exercise.where} {answer.__name__}: want {code}\n{result}"


@pytest.mark.parametrize("chapter, name, answer, code, pattern", _diagnoses())
def test_wrong_answer_diagnosis_points_at_the_line(chapter, name, answer, code, pattern):
    """The finding that names the mistake says where to fix it, in English and in Chinese:
    a reader who sees `inaccurate` with "check the formula" learns nothing."""
    assert pattern, (f"tests/learn/wrong_answers/{chapter}.py: no DIAGNOSIS entry for "
                     f"{answer.__name__}: the words its report must say")
    exercise = BY_NAME[(chapter, name)]
    result = _graded(chapter, name, answer)
    findings = [f for f in result.findings if f.code == code]
    assert findings, f"{exercise.where} {answer.__name__}: want {code}\n{result}"
    messages = " | ".join(f.message for f in findings)
    assert re.search(pattern, messages, re.IGNORECASE), (
        f"{exercise.where} {answer.__name__}: the {code} diagnosis does not point at the line "
        f"to fix (want /{pattern}/): {messages}")
    chinese = result.text(lang="zh")
    assert CJK.search(chinese) and re.search(pattern, chinese, re.IGNORECASE), (
        f"{exercise.where} {answer.__name__}: the Chinese report lacks /{pattern}/:\n{chinese}")


def test_every_exercise_has_three_wrong_answers():
    counts = {(e.chapter, e.name): 0 for e in EXERCISES}
    for param in _answers("WRONG"):
        chapter, name = param.values[0], param.values[1]
        assert (chapter, name) in counts, f"{chapter}: no exercise named {name}"
        counts[(chapter, name)] += 1
    assert all(n >= 3 for n in counts.values()), {k: n for k, n in counts.items() if n < 3}
