"""A check's report as text for a terminal, in the layout its language chooses: ``"table"``
(a row per finding) or ``"blocks"`` (a block per finding, with the code's title and what
to do). Every sentence comes from the catalogue; figures, codes, identifiers and the code
of reproducers are written as they are in every language (a reproducer's comments, printed
labels and assertion messages are sentences)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

from ..catalogue import code_words, doc_link, render, style, words

__all__ = ["report_text"]

Literal = Callable[[str], str] | None


def _header(report: Any, lang: str, literal: Literal) -> list[str]:
    w = words(lang)

    def r(x: Any) -> str:
        return render(x, lang, literal)

    fields = [w["report.framework"].format(value=report.framework or w["report.not-found"]),
              w["report.convention"].format(value=r(report.convention)
                                            or w["report.not-found"])]
    if report.layout:
        fields.append(w["report.layout"].format(value=r(report.layout)))
    lines = [w["report.title"].format(check=report.check, target=report.target),
             "  " + w["sep.fields"].join(fields)]
    if report.causality:
        lines.append("  " + w["report.causality"].format(value=r(report.causality)))
    if report.origin:
        lines.append("  " + r(report.origin))
    lines.append("  " + w["report.cases"].format(n=len(report.cases), seconds=report.seconds))
    if report.check == "attention" and str(report.convention).startswith("none"):
        causal = str(report.causality).startswith("behaves as causal")
        lines.append("  " + w["report.untested-causal" if causal else "report.untested"])
    oracle = getattr(report, "oracle", None) or {"compared": True}
    if report.check == "multi-head":  # what the oracle compared, or why it did not
        if oracle.get("compared", True) and oracle.get("structure"):
            lines.append("  " + w["report.oracle-compared"].format(
                structure=r(oracle["structure"])))
        elif not oracle.get("compared", True):
            lines.append("  " + w["report.oracle-not-compared"].format(
                why=r(oracle.get("why", ""))))
    if not report.findings:
        lines.append("  " + w["report.no-findings" if oracle.get("compared", True)
                              else "report.no-findings-not-compared"])
    return lines


def _table(report: Any, lang: str, literal: Literal) -> list[str]:
    w = words(lang)
    width = max(len(f.code) for f in report.findings)
    pad = f"  {'':8}  {'':{width}}  "
    lines = ["", f"  {w['report.severity']:8}  {w['report.code']:{width}}  "
                 f"{w['report.diagnosis']}"]
    for f in report.findings:
        lines.append(f"  {w[f.severity]:8}  {f.code:{width}}  {render(f.message, lang, literal)}")
        if f.measured:
            lines.append(f"{pad}{w['report.measured']}: {render(f.measured, lang, literal)}")
        if f.case:
            lines.append(f"{pad}{w['report.case']}: {render(f.case, lang, literal)}")
        lines.append(f"{pad}{w['report.see']}: {doc_link(f.code)}")
    return lines


def _blocks(report: Any, lang: str, literal: Literal) -> list[str]:
    w = words(lang)
    lines: list[str] = []
    for f in report.findings:
        cw = code_words(f.code, lang)
        lines += ["", f"  [{w[f.severity]}] {f.code}：{cw['title']}",
                  f"    {cw['what']}{cw['fix']}",  # one line: the terminal wraps it
                  f"    {w['report.detail']}：{render(f.message, lang, literal)}"]
        if f.measured:
            lines.append(f"    {w['report.measured']}：{render(f.measured, lang, literal)}")
        if f.case:
            lines.append(f"    {w['report.case']}：{render(f.case, lang, literal)}")
        lines.append(f"    {w['report.see']}：{doc_link(f.code)}")
    return lines


def report_text(report: Any, lang: str, reproducers: bool = True,
                literal: Literal = None) -> str:
    """``report`` (a :class:`attnkit.check.core.report.Report`) as text in ``lang``.

    Args:
        literal: rewrites every field a sentence quotes as written (an identifier, a
            number, the first line of an exception); tests pass one to see that nothing
            else is left in English.
    """
    w = words(lang)
    lines = _header(report, lang, literal)
    if report.findings:
        lines += (_table if style(lang) == "table" else _blocks)(report, lang, literal)
    if reproducers:
        for f in report.findings:
            if f.reproducer:
                lines += ["", w["report.reproducer"].format(code=f.code),
                          textwrap.indent(render(f.reproducer, lang, literal), "    ")]
    n_err = sum(f.is_error for f in report.findings)
    verdict = w["report.ok"] if report.ok else w["report.failed"]
    lines += ["", w["report.verdict"].format(verdict=verdict, errors=n_err,
                                             warnings=len(report.findings) - n_err)]
    return "\n".join(lines)
