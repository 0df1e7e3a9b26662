"""What ``check_model`` reports: :class:`ModelReport`, one :class:`ImplementationResult` per
implementation, one :class:`LayerRow` per attention module, :class:`ModelFinding`.

The findings use the codes of ``attnkit check`` (:data:`attnkit.check.CODES`), plus
``mask-mismatch``; each names the step (0 = the prefill), the layer (the attention module's
path) and the first batch row, head, query and key concerned.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .messages import ZH_CODES, ZH_WORDS, check_language, get_language
from .report import CODES, ERROR, Finding

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

    @property
    def severity(self) -> str:
        # A convention for a lone function, a defect inside a model: the model's own mask
        # is bottom-right, so a top-left function changes what it computes with a cache.
        return ERROR if self.code == "causal-alignment" else CODES[self.code][0]


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
    _ratio: float = field(default=0.0, repr=False)


@dataclass
class ImplementationResult:
    """What one implementation did.

    Attributes:
        name: the ``attn_implementation`` checked.
        status: ``"ran"``, ``"refused: ..."`` (the model or the implementation declined,
            e.g. SDPA with a softcap), or ``"stopped at ..."`` (it raised in a call).
        layers: one :class:`LayerRow` per attention module, in call order.
        findings: at most one per code (the first), errors first.
        hidden: per hidden state (``"embeddings"``, ``"layer 0"``, ...): max relative
            difference to the first implementation's, over real tokens and steps.
        first_failing_layer: the first layer whose own attention failed, or None.
        masks: how the masks arrived (``"bool mask"``, ``"additive float mask"``, ...).
        reproducer: the ``.pt`` file of the first failing call, or "".
    """

    name: str
    status: str = "ran"
    layers: list[LayerRow] = field(default_factory=list)
    findings: list[ModelFinding] = field(default_factory=list)
    hidden: list[dict] = field(default_factory=list)
    first_failing_layer: str | None = None
    masks: list[str] = field(default_factory=list)
    reproducer: str = ""

    @property
    def ok(self) -> bool:
        return not any(f.is_error for f in self.findings)


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
    """

    model: str
    dtype: str = ""
    inputs: str = ""
    implementations: list[ImplementationResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when no implementation has an error finding."""
        return all(r.ok for r in self.implementations)

    @property
    def codes(self) -> list[str]:
        return sorted({f.code for r in self.implementations for f in r.findings})

    def findings(self, implementation: str) -> list[ModelFinding]:
        return next(r.findings for r in self.implementations if r.name == implementation)

    def to_dict(self, lang: str = "en") -> dict:
        """The report as plain data (``--json``); with ``lang="zh"`` each finding also
        carries its Chinese ``title`` and ``diagnosis`` (codes are the same)."""
        check_language(lang)
        d = asdict(self)
        d["ok"] = self.ok
        for r, item in zip(self.implementations, d["implementations"]):
            item["ok"] = r.ok
            for f, fi in zip(r.findings, item["findings"]):
                fi["severity"] = f.severity
                if lang == "zh":
                    fi["title"], fi["diagnosis"] = ZH_CODES[f.code]
            for row in item["layers"]:
                row.pop("_ratio", None)
        return d

    def to_json(self, lang: str = "en") -> str:
        return json.dumps(self.to_dict(lang), indent=2, ensure_ascii=False)

    def table(self, reproducers: bool = True, lang: str | None = None) -> str:
        """The report as text: per implementation a table by layer, then its findings.

        Args:
            reproducers: print the first reproducer of each implementation.
            lang: ``"en"`` or ``"zh"``; None: :func:`attnkit.check.messages.get_language`.
                In Chinese the headers are Chinese and every finding gets its code's
                Chinese title and diagnosis, with the check's English sentence under it;
                codes, figures, layer names and reproducers are the same.
        """
        zh = check_language(lang or get_language()) == "zh"
        w = ZH_WORDS

        def say(key: str, en: str, **fields: Any) -> str:
            return w[key].format(**fields) if zh else en.format(**fields)

        seconds = say("model seconds", "{seconds:.1f} s", seconds=self.seconds)
        lines = [say("model title", "attnkit check model: {model}", model=self.model),
                 f"  {self.dtype}, {self.inputs}; {seconds}"]
        first = self.implementations[0].name if self.implementations else ""
        for r in self.implementations:
            lines += ["", f"{r.name}: {r.status}" + (f"; {say('masks', 'masks')}: "
                                                     f"{', '.join(r.masks)}" if r.masks else "")]
            if r.layers:
                diff_head = say("versus", "vs {first}: attention / hidden",
                                first=first) if r.name != first else ""
                head = (f"  {say('layer', 'layer'):<34} {say('calls', 'calls'):>5}  "
                        f"{say('worst', 'worst error / rule'):<20} "
                        f"{say('first failure', 'first failure'):<34} "
                        f"{say('empty rows', 'empty rows'):<14} "
                        f"{say('row verdict', 'verdict'):<18} {diff_head}")
                lines.append(head.rstrip())
                for row in r.layers:
                    hold = "/".join(row.empty_hold) if row.empty_rows else ""
                    empty = f"{row.empty_rows} ({hold})" if row.empty_rows else "0"
                    err = f"{row.worst_error:.1e} / {row.bound:.1e}" if row.bound else "-"
                    diff = "" if row.diff_attention is None else f"{row.diff_attention:.1e}"
                    if row.diff_hidden is not None:
                        diff += f" / {row.diff_hidden:.1e}"
                    if row.origin:
                        diff += f" {row.origin}"
                    lines.append(f"  {_short(row.layer):<34} {row.calls:>5}  {err:<20} "
                                 f"{row.first_failure or '-':<34} {empty:<14} "
                                 f"{row.verdict:<18} {diff}".rstrip())
            if r.hidden and r.name != first:
                worst = max(r.hidden, key=lambda h: h["diff"])
                lines.append("  " + say("hidden", "hidden states vs {first}: largest "
                                        "difference {diff:.1e} at {name}", first=first,
                                        diff=worst["diff"], name=worst["name"]))
            if r.first_failing_layer:
                lines.append("  " + say("first failing layer", "first layer whose own "
                                        "attention fails: {layer}",
                                        layer=r.first_failing_layer))
            for f in r.findings:
                if zh:
                    title, diagnosis = ZH_CODES[f.code]
                    lines += [f"  [{w[f.severity]}] {f.code}：{title}", f"    {diagnosis}",
                              f"    {w['detail']}：{f.message}"]
                    if f.measured:
                        lines.append(f"    {w['measured']}：{f.measured}")
                    if f.case:
                        lines.append(f"    {w['at']}：{f.case}")
                    continue
                lines.append(f"  {f.severity:<7}  {f.code}: {f.message}")
                if f.measured:
                    lines.append(f"           measured: {f.measured}")
                if f.case:
                    lines.append(f"           at: {f.case}")
            if reproducers:
                for f in r.findings:
                    if f.reproducer:
                        lines += ["  " + say("model reproducer", "reproducer ({code}, inputs "
                                             "in {where}):", code=f.code, where=r.reproducer)]
                        lines += ["    " + x for x in f.reproducer.splitlines()]
                        break
        n_err = sum(f.is_error for r in self.implementations for f in r.findings)
        n_all = sum(len(r.findings) for r in self.implementations)
        if zh:
            lines += ["", w["verdict"].format(verdict=w["ok"] if self.ok else w["failed"],
                                              errors=n_err, warnings=n_all - n_err)]
        else:
            lines += ["", f"{'OK' if self.ok else 'FAILED'}: {n_err} error(s), "
                          f"{n_all - n_err} warning(s)"]
        return "\n".join(lines)

    def text(self, lang: str | None = None, reproducers: bool = True) -> str:
        """The report as text in ``lang`` (see :meth:`table`), as ``Report.text``."""
        return self.table(reproducers, lang)

    def __str__(self) -> str:
        return self.table()


def _short(path: str) -> str:
    """A module path that fits the table's first column (34 characters)."""
    for long, short in (("model.layers.", "layers."), ("transformer.h.", "h."),
                        ("encoder.block.", "encoder."), ("decoder.block.", "decoder."),
                        (".layer.0.", "."), (".layer.1.", ".")):
        path = path.replace(long, short) if len(path) > 34 else path
    return path if len(path) <= 34 else "..." + path[-31:]
