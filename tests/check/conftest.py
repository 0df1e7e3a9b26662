"""Every check test starts with reports in English: ``print(report)`` follows
``set_language`` and ``ATTNKIT_LANG``, which a test (or the caller's shell) may have set.

And every report a check test makes is also read in Chinese when the test ends, as text
and as JSON (``--json --lang zh``: every sentence field): with the fields its sentences
quote as written (names, figures, the first line of an error) blanked out, no English
sentence may be left (a sentence a check wrote without the catalogue, or a Chinese
template that kept English words; two English words in a row are a sentence), and none in
what a reader reads in the findings' reproducers either: their comments, printed labels
and assertion messages (their code is code, the same in every language). A test whose
report is made by hand from English words, or comes from a check whose sentences are not
in the catalogue yet, says so with ``@pytest.mark.english_report`` (a test that writes
reproducers by hand).
"""

from __future__ import annotations

import re

import pytest

from attnkit.check.catalogue import render, set_language
from attnkit.check.core.report import Report
from attnkit.check.model.report import ModelReport
from attnkit.check.render.json import model_dict, report_dict
from attnkit.check.render.text import report_text

from .reproducers import ROOT, reproducer_prose

# Code, shapes, paths and names: words a reader meets as written in any language (a token
# of code ends where Chinese text begins: "模型：--tiny" leaves "模型：").
_NOT_CJK = r"[^\s\u2e80-\u9fff\u3000-\u303f\uff00-\uffef]"
_CODE = re.compile(r"`[^`]*`|'[^']*'|\"[^\"]*\"|\bdef \w+\(.*?\): return \S+|\([^()]*\)"
                   rf"|{_NOT_CJK}*[._=<>\[\]/:#*+-]{_NOT_CJK}*")
# Three English words in a row, or two in lower case ("last axis"): two capitalised words
# are names and symbols as often as not ("PyTorch SDPA", "Tq Tk", "Dk Dv").
_SENTENCE = re.compile(r"[A-Za-z]{2,}(?: [A-Za-z]{2,}){2,}|\b[a-z]{2,} [a-z]{2,}\b")
# The fields of a JSON report that are not sentences: codes, names, identifiers, the
# values scripts match on (the same in every language), and reproducers (read below).
_NOT_SENTENCES = {"code", "severity", "doc", "target", "framework", "model", "dtype",
                  "layer", "verdict", "empty_hold", "reproducer"}


def english_sentences(text: str) -> list[str]:
    """Runs of three or more English words in ``text``, or of two in lower case, code and
    names left out."""
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
        data = (model_dict if isinstance(report, ModelReport) else report_dict)(
            report, "zh", literal=lambda s: "…")
        left = [(path, s) for path, value in json_sentences(data)
                for s in english_sentences(value)]
        assert not left, f"English in a Chinese JSON report: {left}"
        findings = ([f for r in report.implementations for f in r.findings]
                    if isinstance(report, ModelReport) else report.findings)
        for f in findings:
            code = render(f.reproducer, "zh", literal=lambda s: "…")
            left = [s for prose in reproducer_prose(code) for s in english_sentences(prose)]
            assert not left, f"English in a Chinese reproducer of {f.code}: {left}\n{code}"


def json_sentences(data: object, path: str = "") -> list[tuple[str, str]]:
    """``(path, text)`` of every sentence field of a JSON report (``report_dict``,
    ``model_dict``): its strings but the names, codes and values of :data:`_NOT_SENTENCES`
    and a layer's ``origin`` (``"made here"``, ``"inherited"``: values, not sentences)."""
    if isinstance(data, dict):
        return [x for key, value in data.items() if key not in _NOT_SENTENCES
                and not (key == "origin" and "layers" in path)
                for x in json_sentences(value, f"{path}.{key}")]
    if isinstance(data, list):
        return [x for i, value in enumerate(data) for x in json_sentences(value, f"{path}[{i}]")]
    return [(path, data)] if isinstance(data, str) else []


@pytest.fixture
def english_in():
    return english_sentences


@pytest.fixture
def at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test runs from the repository's root, where reproducers find the files they name
    (``pytestmark = pytest.mark.usefixtures("at_root")``)."""
    monkeypatch.chdir(ROOT)
