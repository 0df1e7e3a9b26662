"""What a check finds: :class:`Finding`, :class:`Report`.

Every finding carries a stable code of the catalogue (:mod:`attnkit.check.catalogue`); its
severity follows from the code and the kind of check (``fully-masked-row`` and
``causal-alignment`` are warnings in a function check, because peers disagree on them).
A report is ``ok`` when it holds no error. How a report is shown: :mod:`attnkit.check.render`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..catalogue import (
    CATALOGUE,
    ERROR,
    WARNING,
    T,
    Text,
    code_words,
    first_line,
    get_language,
    severity,
)
from ..catalogue import check_language as _check_language

__all__ = ["CODES", "ERROR", "WARNING", "Finding", "Report", "T", "Text", "first_line"]

# code -> (severity in a function check, what it means), in the order a report lists them
# (made from the catalogue; kept for scripts that read it).
CODES: dict[str, tuple[str, str]] = {
    name: (code.function, code_words(name, "en")["title"]) for name, code in CATALOGUE.items()}


@dataclass
class Finding:
    """One thing a check found.

    Attributes:
        code: a key of :data:`CODES` (stable: scripts may match on it).
        message: one line, in plain words: what is wrong and what to do (a
            :class:`~attnkit.check.catalogue.Text`: a template of the catalogue, so that
            it is written in the report's language; as a ``str``, its English).
        measured: the error against the rule, or what was observed (a ``Text`` too).
        case: the inputs it was found on (dtype and shapes; a ``Text`` too).
        reproducer: a few lines of Python that, run as printed, show the bug.
    """

    code: str
    message: str
    measured: str = ""
    case: str = ""
    reproducer: str = ""

    kind: ClassVar[str] = "function"  # the kind of check: its severities (catalogue)

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unknown finding code {self.code!r}; known: {sorted(CODES)}")

    @property
    def severity(self) -> str:
        return severity(self.code, self.kind)

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR


@dataclass
class Report:
    """The result of one check.

    Attributes:
        check: ``"softmax"``, ``"masked-softmax"``, ``"attention"``, ``"multi-head"`` or
            ``"block"`` (judged as a module: a block's findings take the multi-head
            severities of the catalogue).
        target: the name of what was checked.
        framework: ``"numpy"`` or ``"torch"``.
        convention: the calling convention used (``"valid_lens"``, ``"masked"``,
            ``"keep"``, ``"sdpa"``, ``"none"``), and how it was chosen.
        layout: the input layout used, e.g. ``"(B, H, T, D)"``.
        causality: for self-attention, whether later positions change earlier outputs
            (``"behaves as causal"`` or ``"bidirectional"``), and the intent if declared;
            for an attention function, ``"behaves as causal (judged as causal; ...)"``
            when it masks the future without being declared causal.
        origin: where the target came from and how it was built, e.g. ``"built as
            MultiHeadedAttention(h=4, d_model=16, dropout=0.0)"`` or ``"defined in cell 3
            of notes.ipynb"`` (empty when there is nothing to say).
        findings: at most one per code, errors first.
        cases: the names of the cases run.
        seconds: wall time of the check.
        oracle: ``{"compared": bool, "why": str}`` (and ``"structure"`` for a module):
            whether the outputs were compared with the float64 oracle, and why not. A
            function check always compares; a multi-head module is compared from its own
            weights where its structure can be read.
    """

    check: str
    target: str
    framework: str = ""
    convention: str = ""
    layout: str = ""
    causality: str = ""
    origin: str = ""
    findings: list[Finding] = field(default_factory=list)
    cases: list[str] = field(default_factory=list)
    seconds: float = 0.0
    oracle: dict = field(default_factory=lambda: {"compared": True, "why": ""})

    @property
    def ok(self) -> bool:
        """True when no finding is an error (warnings allowed)."""
        return not any(f.is_error for f in self.findings)

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def stopped(self, err: BaseException, running: Text) -> None:
        """Add the ``call-failed`` finding for a check that ``err`` stopped while it was
        running ``running`` (``"fn"``, ``"the module"``): a report, never a traceback."""
        self.add(Finding("call-failed", T("report.stopped", running=running,
                                          error=f"{type(err).__name__}: {first_line(err)}"),
                         T("measured.raised", name=type(err).__name__),
                         case=self.cases[-1] if self.cases else ""))

    def add(self, finding: Finding) -> None:
        """Keep the first finding of each code (the cases run smallest first)."""
        if finding.code not in self.codes:
            if self.check in ("multi-head", "block"):  # a block is judged as a module
                finding.kind = "multi-head"
            self.findings.append(finding)
            order = list(CODES)
            self.findings.sort(key=lambda f: order.index(f.code))

    def to_dict(self, lang: str = "en") -> dict:
        """The report as plain data (``--json``), its sentences in ``lang``; outside English
        each finding also carries its code's ``title`` and ``diagnosis``. Codes are the
        same in every language."""
        from ..render.json import report_dict

        return report_dict(self, lang)

    def to_json(self, lang: str = "en") -> str:
        """:meth:`to_dict` as strict JSON (:func:`attnkit.check.render.json.strict_json`)."""
        from ..render.json import strict_json

        return strict_json(self.to_dict(lang))

    def table(self, reproducers: bool = True, lang: str | None = None) -> str:
        """The report as text for a terminal (:meth:`text`)."""
        return self.text(lang, reproducers)

    def text(self, lang: str | None = None, reproducers: bool = True) -> str:
        """The report as text for a terminal: a header, the findings, then each finding's
        reproducer.

        Args:
            lang: ``"en"`` or ``"zh"``; None: :func:`attnkit.check.catalogue.get_language`
                (``set_language``, else ``ATTNKIT_LANG``, else English). Every sentence is
                written in ``lang`` (a reproducer's comments too); codes, figures and the
                code of reproducers are the same in every language.
        """
        from ..render.text import report_text

        return report_text(self, _check_language(lang or get_language()), reproducers)

    def __str__(self) -> str:
        return self.text()
