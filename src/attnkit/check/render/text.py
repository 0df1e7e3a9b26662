"""A check's report as text for a terminal, in the layout its language chooses: ``"table"``
(a row per finding) or ``"blocks"`` (a block per finding, with the code's title and what
to do): :func:`report_text` for a function, multi-head or block check, :func:`model_text`
for a model check, both writing a finding with :func:`finding_lines` and ending with
:func:`verdict_line`. Every sentence comes from the catalogue; figures, codes, identifiers
and the code of reproducers are written as they are in every language (a reproducer's
comments, printed labels and assertion messages are sentences, in the report's language)."""

from __future__ import annotations

import textwrap
import unicodedata
from collections.abc import Callable
from typing import Any

from ..catalogue import code_words, doc_link, render, style, words

__all__ = ["finding_lines", "model_text", "report_text", "verdict_line"]

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


def _findings(report: Any, lang: str, literal: Literal) -> list[str]:
    """The findings of ``report``: in the ``"table"`` style a header and a row each, in
    ``"blocks"`` a block each."""
    if style(lang) != "table":
        return [line for f in report.findings
                for line in ["", *finding_lines(f, lang, literal, "", "", "report.case")]]
    w = words(lang)
    width = max(len(f.code) for f in report.findings)
    lines = ["", f"  {w['report.severity']:8}  {w['report.code']:{width}}  "
                 f"{w['report.diagnosis']}"]
    row = f"  {{severity:8}}  {{code:{width}}}  {{message}}"
    for f in report.findings:
        lines += finding_lines(f, lang, literal, row, f"  {'':8}  {'':{width}}  ",
                               "report.case")
    return lines


def finding_lines(finding: Any, lang: str, literal: Literal, row: str, indent: str,
                  case: str, link: bool = True) -> list[str]:
    """One finding in ``lang``, the same for every kind of check.

    Args:
        finding: a :class:`attnkit.check.core.report.Finding` (a model's too).
        row: its first line in the ``"table"`` style, a template with ``{severity}``,
            ``{code}`` and ``{message}``; the ``"blocks"`` style writes the code's title,
            what is wrong and how to fix it, then the message.
        indent: what precedes the lines after the first in the ``"table"`` style.
        case: the catalogue's word for where the finding was made (``"report.case"``,
            ``"model.at"``).
        link: end with the link to the code's reference page.

    Returns:
        The lines: the first, then what was measured, the case and the link (each only
        when there is one).
    """
    w = words(lang)
    message, measured, where = (render(x, lang, literal)
                                for x in (finding.message, finding.measured, finding.case))
    if style(lang) == "table":
        lines = [row.format(severity=w[finding.severity], code=finding.code, message=message)]
        sep = ": "
    else:
        cw = code_words(finding.code, lang)
        lines = [f"  [{w[finding.severity]}] {finding.code}：{cw['title']}",
                 f"    {cw['what']}{cw['fix']}",  # one line: the terminal wraps it
                 f"    {w['report.detail']}：{message}"]
        indent, sep = "    ", "："
    labelled = [(w["report.measured"], measured), (w[case], where),
                (w["report.see"], doc_link(finding.code) if link else "")]
    return lines + [f"{indent}{label}{sep}{value}" for label, value in labelled if value]


def verdict_line(ok: bool, errors: int, warnings: int, lang: str) -> str:
    """The last line of a report: ``"FAILED: 2 error(s), 0 warning(s)"``."""
    w = words(lang)
    return w["report.verdict"].format(verdict=w["report.ok" if ok else "report.failed"],
                                      errors=errors, warnings=warnings)


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
        lines += _findings(report, lang, literal)
    if reproducers:
        for f in report.findings:
            if f.reproducer:
                lines += ["", w["report.reproducer"].format(code=f.code),
                          textwrap.indent(render(f.reproducer, lang, literal), "    ")]
    n_err = sum(f.is_error for f in report.findings)
    lines += ["", verdict_line(report.ok, n_err, len(report.findings) - n_err, lang)]
    return "\n".join(lines)


# -- a model check's report (attnkit.check.model.report.ModelReport) ------------------------
def model_text(report: Any, lang: str, reproducers: bool = True,
               literal: Literal = None) -> str:
    """``report`` (a :class:`attnkit.check.model.report.ModelReport`) as text in ``lang``:
    per implementation a table by layer, then its findings.

    Args:
        reproducers: print the first failing call's reproducer of each implementation
            (its code as saved, its comments in ``lang``).
        literal: as for :func:`report_text`.
    """
    w = words(lang)
    lines = [w["model.title"].format(model=report.model),
             "  " + w["model.inputs"].format(dtype=report.dtype, seconds=report.seconds,
                                             inputs=render(report.inputs, lang, literal))]
    lines += [w["model.fact line"].format(note=render(n, lang, literal)) for n in report.notes]
    first = report.implementations[0].name if report.implementations else ""
    for r in report.implementations:
        lines += _result_lines(r, first, lang, literal, reproducers)
    return "\n".join(lines + _model_verdict(report, lang, literal))


def _model_verdict(report: Any, lang: str, literal: Literal) -> list[str]:
    """The last lines: the verdict with the count of errors and warnings, and what it does
    not cover (nothing judged, layers not checked, an implementation not loaded)."""
    w = words(lang)
    results = report.implementations
    n_err = sum(f.is_error for r in results for f in r.findings)
    n_warn = sum(len(r.findings) + bool(r.note) + sum(bool(x.note) for x in r.layers)
                 for r in results) - n_err
    lines = ["", verdict_line(report.ok, n_err, n_warn, lang)]
    if not report.judged:
        lines.append(w["model.nothing judged"])
    else:
        unseen = sum(row.verdict == "not checked" for r in results for row in r.layers)
        if unseen:
            lines.append(w["model.layers not checked"].format(n=unseen))
    if any(r.unloaded for r in results):
        lines.append(w["model.failed because"].format(
            reason=render(report.reason, lang, literal)))
    return lines


def _result_lines(r: Any, first: str, lang: str, literal: Literal,
                  reproducers: bool) -> list[str]:
    """One implementation's part: its status, its table by layer, the hidden states'
    difference to the first implementation, its findings, the layers not judged and
    (``reproducers``) its first reproducer."""
    w = words(lang)
    status = w["model.ran"] if r.status == "ran" else render(r.status, lang, literal)
    masks = w["sep.list"].join(render(m, lang, literal) for m in r.masks)
    name = render(r.name, lang, literal)
    lines = ["", f"{name}: {status}" + (f"{w['model.masks']}{masks}" if r.masks else "")]
    if r.note:
        lines.append(w["model.not checked"])
    if r.layers:
        lines += _table_lines(r, first, lang, literal)
    if r.hidden and r.name != first:
        worst = max(r.hidden, key=lambda h: h["diff"])
        lines.append("  " + w["model.hidden"].format(
            first=render(first, lang, literal), diff=worst["diff"],
            name=render(worst["name"], lang, literal)))
    if r.first_failing_layer:
        lines.append("  " + w["model.first failing"].format(
            layer=render(r.first_failing_layer, lang, literal)))
    for f in r.findings:
        lines += finding_lines(f, lang, literal, "  {severity:<7}  {code}: {message}",
                               " " * 11, "model.at", link=False)
    for row in r.layers:  # a layer (or calls of it) never judged: named, with why
        if row.note:
            lines.append(w["model.layer not checked"].format(
                layer=row.layer, why=render(row.note, lang, literal)))
    repro = next((f for f in r.findings if f.reproducer), None) if reproducers else None
    if repro is not None:
        lines.append("  " + w["model.reproducer"].format(code=repro.code, path=r.reproducer))
        lines += ["    " + x for x in render(repro.reproducer, lang, literal).splitlines()]
    return lines


def _table_lines(r: Any, first: str, lang: str, literal: Literal) -> list[str]:
    """The table by layer of one implementation: a header, then a row per layer."""
    w = words(lang)
    diff_head = w["model.vs"].format(first=render(first, lang, literal)) \
        if r.name != first else ""
    head = (f"  {_pad(w['model.layer'], 34)} {_pad(w['model.calls'], 5, True)}  "
            f"{_pad(w['model.worst'], 20)} {_pad(w['model.first failure'], 34)} "
            f"{_pad(w['model.empty rows'], 14)} {_pad(w['model.verdict'], 18)} {diff_head}")
    lines = [head.rstrip()]
    shown = [_short(row.layer) for row in r.layers]
    if len(set(shown)) < len(set(row.layer for row in r.layers)):
        shown = [row.layer for row in r.layers]  # shortened, two would merge
    for row, name in zip(r.layers, shown):
        # what the empty rows hold, unread on calls judged outside transformers
        hold = "/".join(w.get("model.hold." + h, h) for h in row.empty_hold)
        empty = f"{row.empty_rows} ({hold})" if row.empty_rows and hold else str(row.empty_rows)
        err = f"{row.worst_error:.1e} / {row.bound:.1e}" if row.bound else "-"
        diff = "" if row.diff_attention is None else f"{row.diff_attention:.1e}"
        if row.diff_hidden is not None:
            diff += f" / {row.diff_hidden:.1e}"
        if row.origin:
            diff += f" {w.get('model.' + row.origin, row.origin)}"
        first_failure = render(row.first_failure, lang, literal) or "-"
        verdict = w.get("model.row." + row.verdict, row.verdict)  # else a code
        lines.append(f"  {name:<34} {row.calls:>5}  {err:<20} "
                     f"{_pad(first_failure, 34)} {_pad(empty, 14)} "
                     f"{_pad(verdict, 18)} {diff}".rstrip())
    return lines


def _pad(text: str, width: int, right: bool = False) -> str:
    """``text`` padded to ``width`` terminal columns (a Chinese character takes two)."""
    cols = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    fill = " " * max(0, width - cols)
    return fill + text if right else text + fill


def _short(path: str) -> str:
    """A module path that fits the table's first column (34 characters)."""
    for long, short in (("model.layers.", "layers."), ("transformer.h.", "h."),
                        ("encoder.block.", "encoder."), ("decoder.block.", "decoder."),
                        (".layer.0.", "."), (".layer.1.", ".")):
        path = path.replace(long, short) if len(path) > 34 else path
    return path if len(path) <= 34 else "..." + path[-31:]
