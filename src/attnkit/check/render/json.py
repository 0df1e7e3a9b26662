"""A check's report as plain data (``--json``), in any language of the catalogue: the
codes, severities, figures and the reproducers' code are the same in every language; the
sentences (``message``, ``measured``, ``case``, the header's, and the comments of a model
check's reproducer) are written in the language asked for, and outside English each
finding also carries its code's ``title`` and ``diagnosis``."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..catalogue import check_language, code_words, doc_link, render

__all__ = ["finding_dict", "report_dict"]

_SENTENCES = ("message", "measured", "case")
_HEADER = ("convention", "layout", "causality", "origin")


def finding_dict(finding: Any, item: dict, lang: str) -> dict:
    """``item`` (``asdict(finding)``) with its severity, link and sentences in ``lang``."""
    item["severity"] = finding.severity
    item["doc"] = doc_link(finding.code)
    for name in _SENTENCES:
        item[name] = render(getattr(finding, name), lang)
    # the same code in every language; a model check's comments in it are sentences
    item["reproducer"] = render(getattr(finding, "reproducer", ""), lang)
    if lang != "en":
        cw = code_words(finding.code, lang)
        item["title"], item["diagnosis"] = cw["title"], cw["what"] + cw["fix"]
    return item


def report_dict(report: Any, lang: str = "en") -> dict:
    """``report`` (a :class:`attnkit.check.core.report.Report`) as plain data."""
    check_language(lang)
    d = asdict(report)
    d["ok"] = report.ok
    for name in _HEADER:
        d[name] = render(getattr(report, name), lang)
    if isinstance(d.get("oracle"), dict):  # its sentences in lang, its flag as it is
        d["oracle"] = {k: (v if isinstance(v, bool) else render(v, lang))
                       for k, v in report.oracle.items()}
    for f, item in zip(report.findings, d["findings"]):
        finding_dict(f, item, lang)
    return d
