"""A check's report as plain data (``--json``), in any language of the catalogue: the
codes, severities, figures and the reproducers' code are the same in every language; the
sentences (``message``, ``measured``, ``case``, the header's, and the comments of a model
check's reproducer) are written in the language asked for, and outside English each
finding also carries its code's ``title`` and ``diagnosis``. :func:`report_dict` for a
function, multi-head or block check, :func:`model_dict` for a model check, and
:func:`strict_json` to write either."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from ..catalogue import check_language, code_words, doc_link, render

__all__ = ["finding_dict", "model_dict", "report_dict", "strict_json"]

_SENTENCES = ("message", "measured", "case")
_HEADER = ("convention", "layout", "causality", "origin")


Literal = Callable[[str], str] | None


def finding_dict(finding: Any, item: dict, lang: str, literal: Literal = None) -> dict:
    """``item`` (``asdict(finding)``) with its severity, link and sentences in ``lang``
    (``literal``: as for :func:`report_dict`)."""
    item["severity"] = finding.severity
    item["doc"] = doc_link(finding.code)
    for name in _SENTENCES:
        item[name] = render(getattr(finding, name), lang, literal)
    # the same code in every language; a model check's comments in it are sentences
    item["reproducer"] = render(getattr(finding, "reproducer", ""), lang, literal)
    if lang != "en":
        cw = code_words(finding.code, lang)
        item["title"], item["diagnosis"] = cw["title"], cw["what"] + cw["fix"]
    return item


def report_dict(report: Any, lang: str = "en", literal: Literal = None) -> dict:
    """``report`` (a :class:`attnkit.check.core.report.Report`) as plain data.

    Args:
        literal: rewrites every field a sentence quotes as written (an identifier, a
            number, the first line of an exception); tests pass one to see that nothing
            else is left in English.
    """
    check_language(lang)
    d = asdict(report)
    d["ok"] = report.ok
    for name in _HEADER:
        d[name] = render(getattr(report, name), lang, literal)
    d["cases"] = [render(c, lang, literal) for c in report.cases]
    if isinstance(d.get("oracle"), dict):  # its sentences in lang, its flag as it is
        d["oracle"] = {k: (v if isinstance(v, bool) else render(v, lang, literal))
                       for k, v in report.oracle.items()}
    for f, item in zip(report.findings, d["findings"]):
        finding_dict(f, item, lang, literal)
    return d


def model_dict(report: Any, lang: str = "en", literal: Literal = None) -> dict:
    """``report`` (a :class:`attnkit.check.model.report.ModelReport`) as plain data: as
    :func:`dataclasses.asdict`, with its verdict (``ok``, ``judged``, ``reason``), whether
    the calls were compared with the oracle, and each implementation's and finding's
    sentences in ``lang`` (``literal``: as for :func:`report_dict`)."""
    check_language(lang)
    d = asdict(report)
    d["inputs"] = render(report.inputs, lang, literal)
    d["ok"] = report.ok
    d["judged"] = report.judged
    d["reason"] = render(report.reason, lang, literal) or None
    # As on every report: whether the calls were compared with the float64 oracle (each
    # judged call is; a run that judged none says why).
    why = "" if report.judged else (d["reason"] or next(
        (render(r.status, lang, literal) for r in report.implementations if r.status), ""))
    d["oracle"] = {"compared": report.judged, "why": why}
    d["notes"] = [render(n, lang, literal) for n in report.notes]
    for r, item in zip(report.implementations, d["implementations"]):
        item["ok"], item["calls"] = r.ok, r.calls
        item["name"] = render(r.name, lang, literal)  # "fn in layers": a sentence
        item["warning"] = render(r.note, lang, literal) or None
        item["status"] = render(r.status, lang, literal)
        item["masks"] = [render(m, lang, literal) for m in r.masks]
        for h in item["hidden"]:
            h["name"] = render(h["name"], lang, literal)
        item["first_failing_layer"] = render(r.first_failing_layer, lang, literal) or None
        for f, fi in zip(r.findings, item["findings"]):
            finding_dict(f, fi, lang, literal)
            fi["implementation"] = render(f.implementation, lang, literal)
        for row in item["layers"]:
            row["first_failure"] = render(row["first_failure"], lang, literal)
            row["note"] = render(row.get("note", ""), lang, literal)
            row.pop("_ratio", None)
            row.pop("_nan_step", None)
    return d


def strict_json(data: dict) -> str:
    """``data`` as strict JSON: a non-finite number is ``null`` (NaN) or the string
    ``"inf"`` / ``"-inf"``, never the ``NaN``/``Infinity`` that JSON parsers refuse."""
    return json.dumps(_finite(data), indent=2, ensure_ascii=False, allow_nan=False)


def _finite(x: object) -> object:
    """``x`` with every non-finite float replaced: NaN by None, +-inf by ``"inf"``,
    ``"-inf"`` (in dicts, lists and tuples)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
