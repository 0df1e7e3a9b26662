"""Every check test starts with reports in English: ``print(report)`` follows
``set_language`` and ``ATTNKIT_LANG``, which a test (or the caller's shell) may have set.

And every report a check test makes is also read in Chinese when the test ends: with the
fields its sentences quote as written (names, figures, the first line of an error) blanked
out, no English sentence may be left (a sentence a check wrote without the catalogue, or a
Chinese template that kept English words), and none in what a reader reads in the findings'
reproducers either: their comments, printed labels and assertion messages (their code is
code, the same in every language). A test whose report is made by hand from English
words, or comes from a check whose sentences are not in the catalogue yet, says so with
``@pytest.mark.english_report`` (a test that writes reproducers by hand).
"""

from __future__ import annotations

import re

import pytest

from attnkit.check.catalogue import render, set_language
from attnkit.check.core.report import Report
from attnkit.check.model.report import ModelReport
from attnkit.check.render.text import report_text

from .reproducers import ROOT, reproducer_prose

# Code, shapes, paths and names: words a reader meets as written in any language.
_CODE = re.compile(r"`[^`]*`|'[^']*'|\"[^\"]*\"|\bdef \w+\(.*?\): return \S+|\([^()]*\)"
                   r"|\S*[._=<>\[\]/:#*+-]\S*")
_SENTENCE = re.compile(r"[A-Za-z]{2,}(?: [A-Za-z]{2,}){2,}")


def english_sentences(text: str) -> list[str]:
    """Runs of three or more English words in ``text``, code and names left out."""
    found = []
    for line in text.splitlines():
        prose = line
        for _ in range(3):  # nested parentheses
            prose = _CODE.sub(" ", prose)
        found += _SENTENCE.findall(re.sub(r"\s+", " ", prose))
    return found


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "english_report: the test's reports hold English "
                                       "sentences outside the catalogue (not read in Chinese)")


@pytest.fixture(autouse=True)
def english_by_default(monkeypatch):
    monkeypatch.delenv("ATTNKIT_LANG", raising=False)
    set_language(None)
    yield
    set_language(None)


@pytest.fixture(autouse=True)
def reports_read_in_chinese(request, monkeypatch):
    made: list = []
    for cls in (Report, ModelReport):
        def init(self, *args, __init=cls.__init__, **kwargs):
            __init(self, *args, **kwargs)
            made.append(self)

        monkeypatch.setattr(cls, "__init__", init)
    yield
    if request.node.get_closest_marker("english_report"):
        return
    for report in made:
        if isinstance(report, ModelReport):
            text = report.text(lang="zh", reproducers=False, literal=lambda s: "…")
        else:
            text = report_text(report, "zh", reproducers=False, literal=lambda s: "…")
        left = english_sentences(text)
        assert not left, f"English in a Chinese report: {left}\n{text}"
        findings = ([f for r in report.implementations for f in r.findings]
                    if isinstance(report, ModelReport) else report.findings)
        for f in findings:
            code = render(f.reproducer, "zh", literal=lambda s: "…")
            left = [s for prose in reproducer_prose(code) for s in english_sentences(prose)]
            assert not left, f"English in a Chinese reproducer of {f.code}: {left}\n{code}"


@pytest.fixture
def english_in():
    return english_sentences


@pytest.fixture
def at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test runs from the repository's root, where reproducers find the files they name
    (``pytestmark = pytest.mark.usefixtures("at_root")``)."""
    monkeypatch.chdir(ROOT)
