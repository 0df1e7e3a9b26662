"""What a check finds, and how it is shown: :class:`Finding`, :class:`Report`.

Every finding carries a stable code from :data:`CODES`; its severity follows from the code
(``fully-masked-row`` and ``causal-alignment`` are warnings, because peers disagree on them;
every other code is an error). A report is ``ok`` when it holds no error.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import asdict, dataclass, field

from ..catalogue.messages import ZH_CODES, ZH_WORDS, check_language, get_language, zh_phrases

__all__ = ["CODES", "ERROR", "WARNING", "Finding", "Report", "first_line"]

ERROR, WARNING = "error", "warning"

# code -> (severity, what it means), in the order a report lists them.
CODES: dict[str, tuple[str, str]] = {
    "call-failed": (ERROR, "the target could not be built, loaded or called"),
    "nondeterministic": (ERROR, "two identical calls give different outputs"),
    "shape": (ERROR, "wrong output shape"),
    "nan-or-inf": (ERROR, "NaN or inf where the oracle is finite"),
    "float16-overflow": (ERROR, "fails or goes non-finite in half precision only"),
    "mask-polarity": (ERROR, "the mask is read with the opposite meaning"),
    "mask-mismatch": (ERROR, "a model's attention gets (or applies) another mask than its "
                             "config and padding call for"),
    "wrong-scale": (ERROR, "scores scaled by something other than 1/sqrt(Dk)"),
    "inaccurate": (ERROR, "beyond the 2x/3x/5x error rule"),
    "mutates-input": (ERROR, "writes into an argument"),
    "gradient": (ERROR, "gradients disagree with the oracle"),
    "unregistered-parameter": (ERROR, "a parameter the module does not register"),
    "no-gradient": (ERROR, "a parameter that never gets a gradient"),
    "state-dict": (ERROR, "state_dict does not round-trip the module"),
    "dropout-in-eval": (ERROR, "dropout still active after eval()"),
    "causal-leak": (ERROR, "declared causal, a query sees later positions"),
    "mixes-queries": (ERROR, "a query's output changes with another query: heads split or "
                             "merged so that tokens mix"),
    "post-norm": (ERROR, "a block normalises after the residual add where pre-norm was asked"),
    "residual": (ERROR, "a block's residual path is not x + sublayer(norm(x))"),
    "fully-masked-row": (WARNING, "a row with no allowed key is not 0"),
    "causal-alignment": (WARNING, "causal mask aligned top-left, not bottom-right"),
}


def first_line(err: BaseException, limit: int = 160) -> str:
    """The first line of an exception's message, at most ``limit`` characters (``""`` when
    it has none): what a finding quotes of an error the checked code raised."""
    return (str(err).strip().splitlines() or [""])[0][:limit]


@dataclass
class Finding:
    """One thing a check found.

    Attributes:
        code: a key of :data:`CODES` (stable: scripts may match on it).
        message: one line, in plain words: what is wrong and what to do.
        measured: the error against the rule, or what was observed.
        case: the inputs it was found on (dtype and shapes).
        reproducer: a few lines of Python that, run as printed, show the bug.
    """

    code: str
    message: str
    measured: str = ""
    case: str = ""
    reproducer: str = ""

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unknown finding code {self.code!r}; known: {sorted(CODES)}")

    @property
    def severity(self) -> str:
        return CODES[self.code][0]

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR


@dataclass
class Report:
    """The result of one check.

    Attributes:
        check: ``"softmax"``, ``"masked-softmax"``, ``"attention"`` or ``"multi-head"``.
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

    @property
    def ok(self) -> bool:
        """True when no finding is an error (warnings allowed)."""
        return not any(f.is_error for f in self.findings)

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def stopped(self, err: BaseException, running: str) -> None:
        """Add the ``call-failed`` finding for a check that ``err`` stopped while it was
        running ``running`` (``"fn"``, ``"the module"``): a report, never a traceback."""
        self.add(Finding("call-failed", f"the check stopped while running {running}: "
                         f"{type(err).__name__}: {first_line(err)}", type(err).__name__,
                         case=self.cases[-1] if self.cases else ""))

    def add(self, finding: Finding) -> None:
        """Keep the first finding of each code (the cases run smallest first)."""
        if finding.code not in self.codes:
            self.findings.append(finding)
            order = list(CODES)
            self.findings.sort(key=lambda f: order.index(f.code))

    def to_dict(self, lang: str = "en") -> dict:
        """The report as plain data (``--json``). With ``lang="zh"`` each finding also
        carries its Chinese ``title`` and ``diagnosis``; codes are the same in every
        language."""
        check_language(lang)
        d = asdict(self)
        d["ok"] = self.ok
        for f, item in zip(self.findings, d["findings"]):
            item["severity"] = f.severity
            if lang == "zh":
                item["title"], item["diagnosis"] = ZH_CODES[f.code]
        return d

    def to_json(self, lang: str = "en") -> str:
        return json.dumps(self.to_dict(lang), indent=2, ensure_ascii=False)

    def table(self, reproducers: bool = True, lang: str | None = None) -> str:
        """The report as text for a terminal (:meth:`text`)."""
        return self.text(lang, reproducers)

    def text(self, lang: str | None = None, reproducers: bool = True) -> str:
        """The report as text for a terminal: a header, one row per finding, then each
        finding's reproducer.

        Args:
            lang: ``"en"`` or ``"zh"``; None: :func:`attnkit.check.catalogue.messages.get_language`
                (``set_language``, else ``ATTNKIT_LANG``, else English). In Chinese every
                finding gets its code's Chinese title and diagnosis, with the check's own
                English sentence under it; codes, figures and reproducers are the same.
        """
        lang = check_language(lang or get_language())
        if lang == "zh":
            return self._text_zh(reproducers)
        lines = [
            f"attnkit check {self.check}: {self.target}",
            f"  framework {self.framework or 'not found'}, "
            f"convention {self.convention or 'not found'}"
            + (f", layout {self.layout}" if self.layout else ""),
            *([f"  causality: {self.causality}"] if self.causality else []),
        ]
        if self.origin:
            lines.append(f"  {self.origin}")
        lines.append(f"  {len(self.cases)} cases in {self.seconds:.2f} s")
        if self.check == "attention" and self.convention.startswith("none"):
            untested = "masks and empty rows were" if self.causality.startswith(
                "behaves as causal") else "masks, empty rows and causal alignment were"
            lines.append(f"  {untested} not tested: no mask argument was recognised (declare "
                         f"one with --convention valid_lens, masked, keep, sdpa or additive)")
        if not self.findings:
            lines.append("  no findings: every case agrees with the oracle")
        else:
            width = max(len(f.code) for f in self.findings)
            lines.append("")
            lines.append(f"  {'severity':8}  {'code':{width}}  diagnosis")
            for f in self.findings:
                lines.append(f"  {f.severity:8}  {f.code:{width}}  {f.message}")
                if f.measured:
                    lines.append(f"  {'':8}  {'':{width}}  measured: {f.measured}")
                if f.case:
                    lines.append(f"  {'':8}  {'':{width}}  case: {f.case}")
        if reproducers:
            for f in self.findings:
                if f.reproducer:
                    lines += ["", f"reproducer for {f.code}:",
                              textwrap.indent(f.reproducer, "    ")]
        verdict = "OK" if self.ok else "FAILED"
        n_err = sum(f.is_error for f in self.findings)
        lines += ["", f"{verdict}: {n_err} error(s), {len(self.findings) - n_err} warning(s)"]
        return "\n".join(lines)

    def _text_zh(self, reproducers: bool) -> str:
        w = ZH_WORDS
        fields = [f"{w['framework']} {self.framework or w['not found']}",
                  f"{w['convention']} {zh_phrases(self.convention) or w['not found']}"]
        if self.layout:
            fields.append(f"{w['layout']} {zh_phrases(self.layout)}")
        lines = [w["title"].format(check=self.check, target=self.target), "  " + "，".join(fields)]
        if self.causality:
            lines.append(f"  {w['causality']}：{zh_phrases(self.causality)}")
        if self.origin:
            lines.append(f"  {zh_phrases(self.origin)}")
        lines.append("  " + w["cases"].format(n=len(self.cases), seconds=self.seconds))
        if self.check == "attention" and self.convention.startswith("none"):
            causal = self.causality.startswith("behaves as causal")
            lines.append("  " + w["no mask, causal" if causal else "no mask"])
        if not self.findings:
            lines.append("  " + w["no findings"])
        for f in self.findings:
            title, diagnosis = ZH_CODES[f.code]
            lines += ["", f"  [{w[f.severity]}] {f.code}：{title}",
                      f"    {diagnosis}",  # one line: Chinese wraps anywhere, the terminal does it
                      f"    {w['detail']}：{f.message}"]
            if f.measured:
                lines.append(f"    {w['measured']}：{f.measured}")
            if f.case:
                lines.append(f"    {w['case']}：{f.case}")
        if reproducers:
            for f in self.findings:
                if f.reproducer:
                    lines += ["", w["reproducer"].format(code=f.code),
                              textwrap.indent(f.reproducer, "    ")]
        n_err = sum(f.is_error for f in self.findings)
        lines += ["", w["verdict"].format(verdict=w["ok"] if self.ok else w["failed"],
                                          errors=n_err, warnings=len(self.findings) - n_err)]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()
