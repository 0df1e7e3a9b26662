"""What ``check_model`` reports: :class:`ModelReport`, one :class:`ImplementationResult` per
implementation, one :class:`LayerRow` per attention module, :class:`ModelFinding`.

The findings use the codes of ``attnkit check`` (:data:`attnkit.check.CODES`), plus
``mask-mismatch``; each names the step (0 = the prefill), the layer (the attention module's
path) and the first batch row, head, query and key concerned.

How a report is shown (text, ``--json``): :mod:`attnkit.check.render`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..catalogue import CATALOGUE, ERROR, T, check_language, get_language
from ..catalogue.text import Text, join
from ..core.report import Finding
from ..render.json import model_dict, strict_json
from ..render.text import model_text

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
        """The report as plain data (``--json``, :func:`attnkit.check.render.json.model_dict`):
        its sentences in ``lang``; outside English each finding also carries its code's
        ``title`` and ``diagnosis``. Codes and figures are the same in every language."""
        return model_dict(self, lang)

    def to_json(self, lang: str = "en") -> str:
        """Strict JSON: a non-finite number is ``null`` (NaN) or the string ``"inf"`` /
        ``"-inf"``, never the ``NaN``/``Infinity`` that JSON parsers refuse."""
        return strict_json(self.to_dict(lang))

    def table(self, reproducers: bool = True, lang: str | None = None) -> str:
        """The report as text (:meth:`text`)."""
        return self.text(lang, reproducers)

    def text(self, lang: str | None = None, reproducers: bool = True,
             literal: Callable[[str], str] | None = None) -> str:
        """The report as text (:func:`attnkit.check.render.text.model_text`): per
        implementation a table by layer, then its findings.

        Args:
            lang: ``"en"`` or ``"zh"``; None: :func:`attnkit.check.catalogue.get_language`.
                Every sentence is written in ``lang``; outside English each finding gets
                its code's title and diagnosis above the check's own sentence. Codes and
                figures are the same in every language; a reproducer's code too, while
                its comments follow ``lang``.
            reproducers: print the first failing call's reproducer of each implementation.
            literal: rewrites every field a sentence quotes as written (tests).
        """
        return model_text(self, check_language(lang or get_language()), reproducers, literal)

    def __str__(self) -> str:
        return self.text()

