"""What ``check_model`` reports: :class:`ModelReport`, one :class:`ImplementationResult` per
implementation, one :class:`LayerRow` per attention module, :class:`ModelFinding`.

The findings use the codes of ``attnkit check`` (:data:`attnkit.check.CODES`), plus
``mask-mismatch``; each names the step (0 = the prefill), the layer (the attention module's
path) and the first batch row, head, query and key concerned.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import asdict, dataclass, field

from ..catalogue.messages import (
    ZH_CODES,
    ZH_MODEL_PHRASES,
    ZH_MODEL_WORDS,
    ZH_WORDS,
    check_language,
    get_language,
    zh_phrases,
)
from ..core.report import CODES, ERROR, Finding

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

    @property
    def calls(self) -> int:
        """Attention calls seen (judged, or raised: a ``call-failed`` finding)."""
        return sum(row.calls for row in self.layers)

    @property
    def note(self) -> str:
        """A warning when this implementation was not checked (transformers or the model
        refused it, or attnkit's check failed), else ""."""
        if self.status.startswith(("refused", "not judged")) and not self.findings:
            return (f"{self.name} was not checked ({self.calls} call(s) judged): "
                    f"{self.status}")
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
    """

    model: str
    dtype: str = ""
    inputs: str = ""
    implementations: list[ImplementationResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when no implementation has an error finding and at least one attention
        call was judged (a check that judged nothing is not a pass)."""
        return all(r.ok for r in self.implementations) and self.judged

    @property
    def judged(self) -> bool:
        """True when some implementation ran to the end with at least one attention call
        judged (a run refused or cut short by attnkit's own failure does not count)."""
        return any(r.calls and not r.note for r in self.implementations)

    @property
    def codes(self) -> list[str]:
        return sorted({f.code for r in self.implementations for f in r.findings})

    def findings(self, implementation: str) -> list[ModelFinding]:
        return next(r.findings for r in self.implementations if r.name == implementation)

    def to_dict(self, lang: str = "en") -> dict:
        """The report as plain data (``--json``). With ``lang="zh"`` each finding also
        carries its code's Chinese ``title`` and ``diagnosis``; codes never change."""
        check_language(lang)
        d = asdict(self)
        d["ok"] = self.ok
        d["judged"] = self.judged
        for r, item in zip(self.implementations, d["implementations"]):
            item["ok"], item["calls"] = r.ok, r.calls
            item["warning"] = r.note or None
            for f, fi in zip(r.findings, item["findings"]):
                fi["severity"] = f.severity
                if lang == "zh":
                    fi["title"], fi["diagnosis"] = ZH_CODES[f.code]
            for row in item["layers"]:
                row.pop("_ratio", None)
                row.pop("_nan_step", None)
        return d

    def to_json(self, lang: str = "en") -> str:
        return json.dumps(self.to_dict(lang), indent=2, ensure_ascii=False)

    def table(self, reproducers: bool = True, lang: str | None = None) -> str:
        """The report as text (:meth:`text`)."""
        return self.text(lang, reproducers)

    def text(self, lang: str | None = None, reproducers: bool = True) -> str:
        """The report as text: per implementation a table by layer, then its findings.

        Args:
            lang: ``"en"`` or ``"zh"``; None: :func:`attnkit.check.catalogue.messages.get_language`.
                In Chinese the headers are Chinese and every finding gets its code's
                Chinese title and diagnosis, with the check's English sentence under it;
                codes, figures and reproducers are the same.
            reproducers: print the first failing call's reproducer of each implementation.
        """
        lang = check_language(lang or get_language())
        w = ZH_MODEL_WORDS if lang == "zh" else _EN_WORDS
        inputs = zh_phrases(self.inputs, ZH_MODEL_PHRASES) if lang == "zh" else self.inputs
        lines = [w["title"].format(model=self.model),
                 "  " + w["inputs"].format(dtype=self.dtype, inputs=inputs,
                                           seconds=self.seconds)]
        first = self.implementations[0].name if self.implementations else ""
        for r in self.implementations:
            status = w["ran"] if r.status == "ran" else r.status
            lines += ["", f"{r.name}: {status}" + (f"{w['masks']}{', '.join(r.masks)}"
                                                   if r.masks else "")]
            if r.note:
                lines.append(w["not checked"])
            if r.layers:
                diff_head = w["vs"].format(first=first) if r.name != first else ""
                head = (f"  {_pad(w['layer'], 34)} {_pad(w['calls'], 5, True)}  "
                        f"{_pad(w['worst'], 20)} {_pad(w['first failure'], 34)} "
                        f"{_pad(w['empty rows'], 14)} {_pad(w['verdict'], 18)} {diff_head}")
                lines.append(head.rstrip())
                for row in r.layers:
                    hold = "/".join(row.empty_hold) if row.empty_rows else ""
                    empty = f"{row.empty_rows} ({hold})" if row.empty_rows else "0"
                    err = f"{row.worst_error:.1e} / {row.bound:.1e}" if row.bound else "-"
                    diff = "" if row.diff_attention is None else f"{row.diff_attention:.1e}"
                    if row.diff_hidden is not None:
                        diff += f" / {row.diff_hidden:.1e}"
                    if row.origin:
                        diff += f" {w.get(row.origin, row.origin)}"
                    lines.append(f"  {_short(row.layer):<34} {row.calls:>5}  {err:<20} "
                                 f"{row.first_failure or '-':<34} {empty:<14} "
                                 f"{row.verdict:<18} {diff}".rstrip())
            if r.hidden and r.name != first:
                worst = max(r.hidden, key=lambda h: h["diff"])
                lines.append("  " + w["hidden"].format(first=first, diff=worst["diff"],
                                                       name=worst["name"]))
            if r.first_failing_layer:
                lines.append("  " + w["first failing"].format(layer=r.first_failing_layer))
            for f in r.findings:
                lines += _finding_lines(f, w, lang)
            if reproducers:
                for f in r.findings:
                    if f.reproducer:
                        lines += ["  " + w["reproducer"].format(code=f.code, path=r.reproducer)]
                        lines += ["    " + x for x in f.reproducer.splitlines()]
                        break
        n_err = sum(f.is_error for r in self.implementations for f in r.findings)
        n_warn = sum(len(r.findings) + bool(r.note) for r in self.implementations) - n_err
        lines += ["", w["verdict line"].format(verdict=w["OK"] if self.ok else w["FAILED"],
                                               errors=n_err, warnings=n_warn)]
        if not self.judged:
            lines.append(w["nothing judged"])
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


# The words of the table in English; the Chinese ones are ZH_MODEL_WORDS in messages.py.
_EN_WORDS: dict[str, str] = {
    "title": "attnkit check model: {model}",
    "inputs": "{dtype}, {inputs}; {seconds:.1f} s",
    "ran": "ran", "masks": "; masks: ",
    "not checked": "  warning  not checked: no attention call of this implementation was judged",
    "layer": "layer", "calls": "calls", "worst": "worst error / rule",
    "first failure": "first failure", "empty rows": "empty rows", "verdict": "verdict",
    "vs": "vs {first}: attention / hidden",
    "hidden": "hidden states vs {first}: largest difference {diff:.1e} at {name}",
    "first failing": "first layer whose own attention fails: {layer}",
    "measured": "measured", "at": "at",
    "reproducer": "reproducer ({code}, inputs in {path}):",
    "verdict line": "{verdict}: {errors} error(s), {warnings} warning(s)",
    "OK": "OK", "FAILED": "FAILED",
    "nothing judged": "no attention call was judged: this is not a pass",
}


def _finding_lines(f: ModelFinding, w: dict[str, str], lang: str) -> list[str]:
    if lang == "zh":
        title, diagnosis = ZH_CODES[f.code]
        lines = [f"  [{ZH_WORDS[f.severity]}] {f.code}：{title}", f"    {diagnosis}",
                 f"    {ZH_WORDS['detail']}：{f.message}"]
        lines += [f"    {w['measured']}：{f.measured}"] if f.measured else []
        return lines + ([f"    {w['at']}：{f.case}"] if f.case else [])
    lines = [f"  {f.severity:<7}  {f.code}: {f.message}"]
    lines += [f"           measured: {f.measured}"] if f.measured else []
    return lines + ([f"           at: {f.case}"] if f.case else [])


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
