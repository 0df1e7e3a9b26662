"""What ``check_model`` reports: :class:`ModelReport`, one :class:`ImplementationResult` per
implementation, one :class:`LayerRow` per attention module, :class:`ModelFinding`.

The findings use the codes of ``attnkit check`` (:data:`attnkit.check.CODES`), plus
``mask-mismatch``; each names the step (0 = the prefill), the layer (the attention module's
path) and the first batch row, head, query and key concerned.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from ..catalogue import (
    CATALOGUE,
    ERROR,
    T,
    check_language,
    code_words,
    get_language,
    render,
    style,
    words,
)
from ..catalogue.text import Text, join
from ..core.report import Finding
from ..render.json import finding_dict

__all__ = ["ImplementationResult", "LayerRow", "ModelFinding", "ModelReport"]


@dataclass
class ModelFinding(Finding):
    """A :class:`Finding` with the place it was found: implementation, step (0 = the
    prefill, then one per decoding step), layer (the attention module's path), and the
    first batch row, head, query and key concerned (indices within the call)."""

    implementation: str = ""
    step: int | None = None
    layer: str = ""
    batch: int | None = None
    head: int | None = None
    query: int | None = None
    key: int | None = None

    # Severities of a model check (the catalogue): causal-alignment, a convention for a
    # lone function, is an error inside a model, whose own mask is bottom-right.
    kind: ClassVar[str] = "model"


@dataclass
class LayerRow:
    """One attention module of one implementation, over every step.

    Attributes:
        layer: the module's path in the model (``"model.layers.0.self_attn"``).
        calls: calls judged.
        worst_error, bound: the call whose error is largest relative to its rule bound.
        first_failure: where the first failing row was (``"step 1, batch 0, head 2,
            query 0"``), or "".
        empty_rows: queries with no allowed key (over steps and batch rows).
        empty_hold: what those rows hold: ``"0"``, ``"uniform"``, ``"NaN"``, ``"other"``.
        verdict: ``"ok"`` or the code of the first finding of this layer.
        diff_attention: max |difference| of the attention output to the first
            implementation's (real queries), relative to its largest value; None for the
            first implementation.
        diff_hidden: the same for the hidden state after the block holding this module.
        origin: ``"made here"`` (its own attention fails), ``"inherited"`` (it passes, but
            its output differs from the first implementation's), or "".
        note: why the layer (or some of its calls) was not judged, or "" (verdict
            ``"not checked"``: no judged call accounts for it).
    """

    layer: str
    calls: int = 0
    worst_error: float = 0.0
    bound: float = 0.0
    first_failure: str = ""
    empty_rows: int = 0
    empty_hold: list[str] = field(default_factory=list)
    verdict: str = "ok"
    diff_attention: float | None = None
    diff_hidden: float | None = None
    origin: str = ""
    note: str = ""
    _ratio: float = field(default=0.0, repr=False)
    _nan_step: int | None = field(default=None, repr=False)  # first step a row held NaN


@dataclass
class ImplementationResult:
    """What one implementation did.

    Attributes:
        name: the ``attn_implementation`` checked.
        status: ``"ran"``, ``"refused: ..."`` (the model or transformers declined the
            implementation, e.g. SDPA with a softcap: a warning, see :attr:`note`), or
            ``"stopped at ..."`` (it raised in a call: a ``call-failed`` finding).
        layers: one :class:`LayerRow` per attention module, in call order.
        findings: at most one per code (the first), errors first.
        hidden: per hidden state (``"embeddings"``, ``"layer 0"``, ...): max relative
            difference to the first implementation's, over real tokens and steps.
        first_failing_layer: the first layer whose own attention failed, or None.
        masks: how the masks arrived (``"bool mask"``, ``"additive float mask"``, ...).
        reproducer: the ``.pt`` file of the first failing call, or "".
        unloaded: the implementation could not be loaded (a package it needs is missing):
            the report fails.
    """

    name: str
    status: str = "ran"
    layers: list[LayerRow] = field(default_factory=list)
    findings: list[ModelFinding] = field(default_factory=list)
    hidden: list[dict] = field(default_factory=list)
    first_failing_layer: str | None = None
    masks: list[str] = field(default_factory=list)
    reproducer: str = ""
    unloaded: bool = False

    @property
    def ok(self) -> bool:
        """No error finding, and it could be loaded (a layer not checked is a warning,
        named with why)."""
        return not any(f.is_error for f in self.findings) and not self.unloaded

    @property
    def unchecked(self) -> list[LayerRow]:
        """The attention modules of the model that no judged call came from."""
        return [row for row in self.layers if row.verdict == "not checked"]

    @property
    def calls(self) -> int:
        """Attention calls seen (judged, or raised: a ``call-failed`` finding)."""
        return sum(row.calls for row in self.layers)

    def add(self, finding: ModelFinding) -> None:
        """Keep the first finding of each code, errors first, then in the catalogue's
        order."""
        if any(f.code == finding.code for f in self.findings):
            return
        self.findings.append(finding)
        order = list(CATALOGUE)
        self.findings.sort(key=lambda f: (f.severity != ERROR, order.index(f.code)))

    @property
    def note(self) -> str:
        """A warning when this implementation was not checked (transformers or the model
        refused it, or attnkit's check failed), else ""."""
        if self.status.startswith(("refused", "not judged")) and not self.findings:
            return T("model.note", name=self.name, calls=self.calls, status=self.status)
        return ""


@dataclass
class ModelReport:
    """The result of :func:`check_model`.

    Attributes:
        model: what was checked (class name, or the path / tiny family given).
        dtype: the model's dtype.
        inputs: the inputs in words (batch, length, padding, decoding steps).
        implementations: one :class:`ImplementationResult` each, in the order given
            (differences are measured against the first).
        seconds: wall time.
        notes: facts about the model said as facts, not findings (a layer's own mask
            code that the config does not describe, packed documents the model does not
            split, decoding not applicable).
    """

    model: str
    dtype: str = ""
    inputs: str = ""
    implementations: list[ImplementationResult] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no implementation has an error finding or could not be loaded, and
        at least one attention call was judged (a check that judged nothing is not a
        pass; a layer not checked is a warning, and the verdict covers the others)."""
        return all(r.ok for r in self.implementations) and self.judged

    @property
    def judged(self) -> bool:
        """True when some implementation ran to the end with at least one attention call
        judged (a run refused or cut short by attnkit's own failure does not count)."""
        return any(r.calls and not r.note for r in self.implementations)

    @property
    def reason(self) -> str:
        """Why the report is not a pass when no finding says it, in one line, else ""."""
        for r in self.implementations:
            if r.unloaded:
                why = r.status.fields.get("why", r.status) if isinstance(r.status, Text) \
                    else r.status.removeprefix("refused: ")
                return T("model.unloaded", name=r.name, why=why)
        for r in self.implementations:
            if r.unchecked:
                names: Any = join([row.layer for row in r.unchecked[:3]], "list")
                if len(r.unchecked) > 3:
                    names = T("model.and-more", names=names, n=len(r.unchecked) - 3)
                return T("model.unchecked-under", n=len(r.unchecked), name=r.name,
                         names=names)
        return ""

    @property
    def codes(self) -> list[str]:
        return sorted({f.code for r in self.implementations for f in r.findings})

    def add(self, finding: Finding) -> None:
        """Keep ``finding`` (a :class:`ModelFinding`, as :func:`attnkit.check.core.spine.follow`
        hands it) in the result of its implementation: the latest result of that name, the
        run it was found in."""
        if not isinstance(finding, ModelFinding):
            raise TypeError(f"a model report keeps ModelFinding, got {type(finding).__name__}")
        result = next(r for r in reversed(self.implementations)
                      if r.name == finding.implementation)
        result.add(finding)

    def findings(self, implementation: str) -> list[ModelFinding]:
        return next(r.findings for r in self.implementations if r.name == implementation)

    def to_dict(self, lang: str = "en") -> dict:
        """The report as plain data (``--json``). With ``lang="zh"`` each finding also
        carries its code's Chinese ``title`` and ``diagnosis``; codes never change."""
        check_language(lang)
        d = asdict(self)
        d["inputs"] = render(self.inputs, lang)
        d["ok"] = self.ok
        d["judged"] = self.judged
        d["reason"] = render(self.reason, lang) or None
        # As on every report: whether the calls were compared with the float64 oracle (each
        # judged call is; a run that judged none says why).
        why = "" if self.judged else (d["reason"] or next(
            (render(r.status, lang) for r in self.implementations if r.status), ""))
        d["oracle"] = {"compared": self.judged, "why": why}
        d["notes"] = [render(n, lang) for n in self.notes]
        for r, item in zip(self.implementations, d["implementations"]):
            item["ok"], item["calls"] = r.ok, r.calls
            item["warning"] = render(r.note, lang) or None
            item["status"] = render(r.status, lang)
            item["masks"] = [render(m, lang) for m in r.masks]
            for h in item["hidden"]:
                h["name"] = render(h["name"], lang)
            item["first_failing_layer"] = render(r.first_failing_layer, lang) or None
            for f, fi in zip(r.findings, item["findings"]):
                finding_dict(f, fi, lang)
            for row in item["layers"]:
                row["first_failure"] = render(row["first_failure"], lang)
                row["note"] = render(row.get("note", ""), lang)
                row.pop("_ratio", None)
                row.pop("_nan_step", None)
        return d

    def to_json(self, lang: str = "en") -> str:
        """Strict JSON: a non-finite number is ``null`` (NaN) or the string ``"inf"`` /
        ``"-inf"``, never the ``NaN``/``Infinity`` that JSON parsers refuse."""
        return json.dumps(_strict(self.to_dict(lang)), indent=2, ensure_ascii=False,
                          allow_nan=False)

    def table(self, reproducers: bool = True, lang: str | None = None) -> str:
        """The report as text (:meth:`text`)."""
        return self.text(lang, reproducers)

    def text(self, lang: str | None = None, reproducers: bool = True,
             literal: Callable[[str], str] | None = None) -> str:
        """The report as text: per implementation a table by layer, then its findings.

        Args:
            lang: ``"en"`` or ``"zh"``; None: :func:`attnkit.check.catalogue.get_language`.
                In Chinese the headers are Chinese and every finding gets its code's
                Chinese title and diagnosis, with the check's English sentence under it;
                codes, figures and reproducers are the same.
            reproducers: print the first failing call's reproducer of each implementation.
            literal: rewrites every field a sentence quotes as written (tests).
        """
        lang = check_language(lang or get_language())
        w = {k[len("model."):]: v for k, v in words(lang).items() if k.startswith("model.")}
        inputs = render(self.inputs, lang, literal)
        lines = [w["title"].format(model=self.model),
                 "  " + w["inputs"].format(dtype=self.dtype, inputs=inputs,
                                           seconds=self.seconds)]
        lines += [w["fact line"].format(note=render(n, lang, literal)) for n in self.notes]
        first = self.implementations[0].name if self.implementations else ""
        for r in self.implementations:
            lines += _result_lines(r, first, w, lang, literal, reproducers)
        return "\n".join(lines + self._verdict_lines(w, lang, literal))

    def _verdict_lines(self, w: dict[str, str], lang: str,
                       literal: Callable[[str], str] | None) -> list[str]:
        """The last lines: the verdict with the count of errors and warnings, and what it
        does not cover (nothing judged, layers not checked, an implementation not
        loaded)."""
        n_err = sum(f.is_error for r in self.implementations for f in r.findings)
        n_warn = sum(len(r.findings) + bool(r.note) + sum(bool(x.note) for x in r.layers)
                     for r in self.implementations) - n_err
        lines = ["", w["verdict line"].format(verdict=w["OK"] if self.ok else w["FAILED"],
                                              errors=n_err, warnings=n_warn)]
        if not self.judged:
            lines.append(w["nothing judged"])
        else:
            unseen = sum(row.verdict == "not checked" for r in self.implementations
                         for row in r.layers)
            if unseen:
                lines.append(w["layers not checked"].format(n=unseen))
        if any(r.unloaded for r in self.implementations):
            lines.append(w["failed because"].format(reason=render(self.reason, lang, literal)))
        return lines

    def __str__(self) -> str:
        return self.text()


def _result_lines(r: ImplementationResult, first: str, w: dict[str, str], lang: str,
                  literal: Callable[[str], str] | None, reproducers: bool) -> list[str]:
    """One implementation's part of the text: its status, its table by layer, the hidden
    states' difference to the first implementation, its findings, the layers not judged
    and (``reproducers``) its first reproducer."""
    status = w["ran"] if r.status == "ran" else render(r.status, lang, literal)
    masks = words(lang)["sep.list"].join(render(m, lang, literal) for m in r.masks)
    lines = ["", f"{r.name}: {status}" + (f"{w['masks']}{masks}" if r.masks else "")]
    if r.note:
        lines.append(w["not checked"])
    if r.layers:
        lines += _table_lines(r, first, w, lang, literal)
    if r.hidden and r.name != first:
        worst = max(r.hidden, key=lambda h: h["diff"])
        lines.append("  " + w["hidden"].format(first=first, diff=worst["diff"],
                                               name=render(worst["name"], lang, literal)))
    if r.first_failing_layer:
        lines.append("  " + w["first failing"].format(
            layer=render(r.first_failing_layer, lang, literal)))
    for f in r.findings:
        lines += _finding_lines(f, w, lang, literal)
    for row in r.layers:  # a layer (or calls of it) never judged: named, with why
        if row.note:
            lines.append(w["layer not checked"].format(
                layer=row.layer, why=render(row.note, lang, literal)))
    if reproducers:
        for f in r.findings:
            if f.reproducer:
                lines += ["  " + w["reproducer"].format(code=f.code, path=r.reproducer)]
                lines += ["    " + x for x in render(f.reproducer, lang).splitlines()]
                break
    return lines


def _table_lines(r: ImplementationResult, first: str, w: dict[str, str], lang: str,
                 literal: Callable[[str], str] | None) -> list[str]:
    """The table by layer of one implementation: a header, then a row per layer."""
    diff_head = w["vs"].format(first=first) if r.name != first else ""
    head = (f"  {_pad(w['layer'], 34)} {_pad(w['calls'], 5, True)}  "
            f"{_pad(w['worst'], 20)} {_pad(w['first failure'], 34)} "
            f"{_pad(w['empty rows'], 14)} {_pad(w['verdict'], 18)} {diff_head}")
    lines = [head.rstrip()]
    shown = [_short(row.layer) for row in r.layers]
    if len(set(shown)) < len(set(row.layer for row in r.layers)):
        shown = [row.layer for row in r.layers]  # shortened, two would merge
    for row, name in zip(r.layers, shown):
        hold = "/".join(row.empty_hold) if row.empty_rows else ""
        empty = f"{row.empty_rows} ({hold})" if row.empty_rows else "0"
        err = f"{row.worst_error:.1e} / {row.bound:.1e}" if row.bound else "-"
        diff = "" if row.diff_attention is None else f"{row.diff_attention:.1e}"
        if row.diff_hidden is not None:
            diff += f" / {row.diff_hidden:.1e}"
        if row.origin:
            diff += f" {w.get(row.origin, row.origin)}"
        first_failure = render(row.first_failure, lang, literal) or "-"
        lines.append(f"  {name:<34} {row.calls:>5}  {err:<20} "
                     f"{_pad(first_failure, 34)} {empty:<14} "
                     f"{row.verdict:<18} {diff}".rstrip())
    return lines


def _finding_lines(f: ModelFinding, w: dict[str, str], lang: str,
                   literal: Callable[[str], str] | None) -> list[str]:
    sev = words(lang)[f.severity]
    message, measured, case = (render(x, lang, literal) for x in (f.message, f.measured,
                                                                   f.case))
    if style(lang) == "blocks":
        cw = code_words(f.code, lang)
        lines = [f"  [{sev}] {f.code}：{cw['title']}", f"    {cw['what']}{cw['fix']}",
                 f"    {w['detail']}：{message}"]
        lines += [f"    {w['measured']}：{measured}"] if measured else []
        return lines + ([f"    {w['at']}：{case}"] if case else [])
    lines = [f"  {sev:<7}  {f.code}: {message}"]
    lines += [f"           {w['measured']}: {measured}"] if measured else []
    return lines + ([f"           {w['at']}: {case}"] if case else [])


def _strict(x: object) -> object:
    """``x`` with every non-finite float replaced: NaN by None, +-inf by ``"inf"``,
    ``"-inf"`` (in dicts, lists and tuples)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    return x


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
