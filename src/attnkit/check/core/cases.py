"""The inputs every check runs, written as code.

Each :class:`Case` holds the NumPy source that makes its inputs (``setup``): the checker
runs that source, and a reproducer prints it, so what the reproducer shows is exactly what
the checker saw. Inputs are float64; a case's ``dtype`` says what ``fn`` receives.
The cases are the ones that break kernels: head dims 1, 7 and 59, lengths 1 and 97,
``Tq != Tk`` both ways, ``Dk != Dv``, logits near 1e3 and 1e4 (and -1e3 under a mask),
rows of very different scale, fully masked rows, half precision.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..catalogue import T, Text, join
from .repro import note

__all__ = ["Case", "attention_cases", "case_title", "masked_softmax_cases", "softmax_cases"]

# The words of the cases' names (each part of a name a key of the catalogue: "case.<part>");
# parts that are sizes, dtypes or relations ("Tq != Tk") are written as they are.
_NAMED = ("basic", "masked", "fully masked row", "per-query lengths", "a query with none",
          "causal", "4-D", "probe", "rows of different scale")
_SIZED = {"head dim ": "case.head-dim", "length ": "case.length", "logits ": "case.logits"}


def case_title(name: str) -> Text:
    """A case's name (``"masked, Tq != Tk"``) as a text of the catalogue."""
    parts: list = []
    for part in name.split(", "):
        if part in _NAMED:
            parts.append(T("case." + part.replace(" ", "-")))
            continue
        sized = next((k for k in _SIZED if part.startswith(k)), None)
        parts.append(T(_SIZED[sized], n=part[len(sized):]) if sized else part)
    return join(parts, "fields")


@dataclass(frozen=True)
class Case:
    """One set of inputs.

    Attributes:
        name: what it tests, for the report (``"head dim 59"``).
        dtype: what ``fn`` receives: ``"float32"``, ``"float64"``, ``"float16"``,
            ``"bfloat16"``.
        sizes: ``(B, H, Tq, Tk, Dk, Dv)``; ``H = 0`` means no head axis.
        mask: None, ``"random"`` (every row keeps one key and drops one) or ``"empty"``
            (that, and query 0 sees no key); ``"lens"``/``"lens-empty"`` for d2l lengths
            ``(B,)``; ``"lens-2d"``/``"lens-2d-empty"`` for d2l's per-query lengths
            ``(B, Tq)`` (the empty one gives query 0 of batch row 0 no key).
        logit: scores near this value (q and k chosen so float32 math is exact), or None.
        causal: ``is_causal=True`` (``sdpa`` convention only).
        grads: also compare gradients (PyTorch functions).
        per_key: the mask has one flag per key, ``keep_keys`` ``(B, Tk)`` (a padding
            mask), ``keep`` being it broadcast to every head and query.
        spread: with ``logit``, only query 0's row of scores is near ``logit``, the
            others near 0 (a softmax that subtracts one maximum for the whole array,
            not each row's, turns them into NaN or 0).
    """

    name: str
    dtype: str = "float32"
    sizes: tuple[int, ...] = (2, 3, 5, 5, 8, 8)
    mask: str | None = None
    logit: float | None = None
    causal: bool = False
    grads: bool = False
    per_key: bool = False
    spread: bool = False

    @property
    def half(self) -> bool:
        return self.dtype in ("float16", "bfloat16")

    def label(self, softmax: bool = False) -> Text:
        """The case in words: its name, dtype, shapes, mask and logits (a catalogue text)."""
        B, H, Tq, Tk, Dk, Dv = self.sizes
        if softmax:
            shape = (B, Tq, Tk) if H == 0 else (B, H, Tq, Tk)
            text = f"x {shape}"
        else:
            lead = (B,) if H == 0 else (B, H)
            text = f"q {(*lead, Tq, Dk)}, k {(*lead, Tk, Dk)}, v {(*lead, Tk, Dv)}"
        extras: list = [self.dtype, text]
        if self.mask in ("lens-2d", "lens-2d-empty"):
            extras.append(T(f"case.mask-{self.mask}"))
        elif self.mask:
            extras.append(T("case.mask-per-key" if self.per_key else "case.mask",
                            kind=self.mask))
        if self.logit:
            extras.append(T("case.logits-spread" if self.spread else "case.logits-near",
                            x=f"{self.logit:g}"))
        if self.causal:
            extras.append("is_causal")
        return T("case.label", name=case_title(self.name), details=join(extras, "fields"))

    def smaller(self) -> Case:
        """The same case at the smallest sizes that keep its point (for reproducers)."""
        B, H, Tq, Tk, Dk, Dv = self.sizes
        tq = 1 if Tq == 1 else (2 if Tq < Tk else 3)
        tk = 1 if Tk == 1 else (2 if Tk < Tq else 3)
        if self.mask or self.causal:  # a mask needs a key kept and a key dropped
            tk = max(tk, 2)
        dk = Dk if self.logit or Dk <= 4 else (4 if Dk == Dv else 3)
        dv = Dv if Dv <= 4 else (4 if Dk == Dv else 2)
        b = 2 if self.per_key and self.mask == "empty" else 1  # batch 0 has no key
        return replace(self, sizes=(b, 0 if H == 0 else 1, tq, tk, dk, dv))


def _shape(*dims: int) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def _mask_lines(case: Case, lead: tuple[int, ...], Tq: int, Tk: int) -> list[Text]:
    B = lead[0]
    if case.mask in ("lens-2d", "lens-2d-empty"):
        g = np.random.default_rng(1)
        lens = g.integers(1, Tk + 1, size=(B, Tq))
        lens[:, 0], lens[:, -1] = 1, Tk  # the queries of a batch row differ in length
        if case.mask == "lens-2d-empty":
            lens[0, 0] = 0
        return [note(f"valid_lens = np.array({lens.tolist()})", "repro.per-query-lens")]
    if case.mask in ("lens", "lens-empty"):
        g = np.random.default_rng(1)
        lens = g.integers(1, Tk + 1, size=B)
        if case.mask == "lens-empty":
            lens[0] = 0
        return [note(f"valid_lens = np.array({lens.tolist()})", "repro.lens",
                     lens="valid_lens")]
    if case.mask in ("random", "empty") and case.per_key:
        heads = ", None" * (len(lead) - 1)
        lines = [note(f"keep_keys = g.random({_shape(B, Tk)}) < 0.6",
                      "repro.may-attend-per-key"),
                 note("keep_keys[:, 0], keep_keys[:, 1] = True, False", "repro.batch-keeps")]
        if case.mask == "empty":
            lines.append(note("keep_keys[0] = False", "repro.batch0-no-key"))
        return lines + [note(f"keep = np.broadcast_to(keep_keys[:{heads}, None, :], "
                             f"{_shape(*lead, Tq, Tk)})", "repro.every-query")]
    if case.mask in ("random", "empty"):
        lines = [note(f"keep = g.random({_shape(*lead, Tq, Tk)}) < 0.6", "repro.may-attend"),
                 note("keep[..., 0], keep[..., 1] = True, False", "repro.row-keeps")]
        if case.mask == "empty":
            lines.append(note("keep[..., 0, :] = False", "repro.query0-no-key"))
        return lines
    if case.causal:
        diag = Tk - Tq
        return [note(f"keep = np.tril(np.ones(({Tq}, {Tk}), dtype=bool), k={diag})",
                     "repro.bottom-right")]
    return []


def attention_setup(case: Case) -> Text:
    """NumPy source defining ``q``, ``k``, ``v``, ``d_out`` and ``keep`` or ``valid_lens``
    (its comments in any language: a :class:`Text`)."""
    B, H, Tq, Tk, Dk, Dv = case.sizes
    lead = (B,) if H == 0 else (B, H)
    lines: list = ["g = np.random.default_rng(0)"]
    if case.logit:
        assert Dk == 16, "large-logit cases use Dk = 16 (scale 1/4, exact in float32)"
        lines += [
            f"q = np.round(g.uniform(-2, 2, {_shape(*lead, Tq, Dk)}) * 8) / 8",
            f"k = np.round(g.uniform(-2, 2, {_shape(*lead, Tk, Dk)}) * 8) / 8",
            note(f"q[..., 0], k[..., 0] = 64.0, {case.logit / 16!r}", "repro.every-score",
                 logit=f"{case.logit:g}"),
        ]
        if case.spread:
            lines.append(note("q[..., 1:, 0] = 0.0", "repro.but-query0"))
    else:
        lines += [f"q = g.standard_normal({_shape(*lead, Tq, Dk)})",
                  f"k = g.standard_normal({_shape(*lead, Tk, Dk)})"]
    lines.append(f"v = g.standard_normal({_shape(*lead, Tk, Dv)})")
    lines += _mask_lines(case, lead, Tq, Tk)
    if case.grads:
        lines.append(f"d_out = g.standard_normal({_shape(*lead, Tq, Dv)})")
    return join(lines, "line")


def softmax_setup(case: Case) -> Text:
    """NumPy source defining ``x`` (and ``keep`` or ``valid_lens``, and ``d_y``)."""
    B, H, Tq, Tk, _, _ = case.sizes
    lead = (B,) if H == 0 else (B, H)
    lines: list = ["g = np.random.default_rng(0)"]
    if case.logit:
        lines.append(f"x = {case.logit!r} + 4 * g.standard_normal({_shape(*lead, Tq, Tk)})")
        if case.spread:
            lines.append(note(f"x[..., 1:, :] -= {case.logit!r}", "repro.row0-near",
                              logit=f"{case.logit:g}"))
    else:
        lines.append(f"x = 3 * g.standard_normal({_shape(*lead, Tq, Tk)})")
    lines += _mask_lines(case, lead, Tq, Tk)
    if case.grads:
        lines.append(f"d_y = g.standard_normal({_shape(*lead, Tq, Tk)})")
    return join(lines, "line")


def run_setup(source: str) -> dict[str, np.ndarray]:
    namespace: dict = {"np": np}
    exec(source, namespace)  # our own generated source (see attention_setup)
    return {k: v for k, v in namespace.items() if isinstance(v, np.ndarray)}


def attention_cases(heads: bool, mask: str | None, causal: bool, torch: bool,
                    per_query: bool = False) -> list[Case]:
    """The cases of ``check_attention``, smallest first.

    Args:
        heads: inputs carry a head axis ``(B, H, T, D)``; else ``(B, T, D)``.
        mask: None (no mask argument), ``"mask"`` (bool) or ``"lens"`` (d2l lengths).
        causal: the function takes ``is_causal``.
        torch: the function takes tensors (gradients, bfloat16).
        per_query: with ``mask="lens"``, also d2l's per-query lengths ``(B, Tq)``.
    """
    H = 3 if heads else 0
    cases = [
        Case("basic", sizes=(2, H, 5, 5, 8, 8), grads=torch),
        Case("head dim 1", sizes=(2, H, 9, 9, 1, 1)),
        Case("head dim 7", sizes=(2, H, 9, 9, 7, 7)),
        Case("head dim 59", sizes=(1, H, 9, 9, 59, 59)),
        Case("length 1", sizes=(2, H, 1, 1, 8, 8)),
        Case("length 97", sizes=(1, H, 97, 97, 16, 16)),
        Case("Tq < Tk, Dk != Dv", sizes=(2, H, 3, 11, 7, 5), grads=torch),
        Case("Tq > Tk, Dk != Dv", sizes=(2, H, 11, 3, 5, 7)),
        Case("logits 1e3", sizes=(1, H, 4, 6, 16, 8), logit=1e3),
        Case("logits 1e4", sizes=(1, H, 4, 6, 16, 8), logit=1e4),
        Case("rows of different scale", sizes=(1, H, 4, 6, 16, 8), logit=1e3, spread=True),
    ]
    if mask is not None:
        kind = "lens" if mask == "lens" else "random"
        cases += [
            Case("masked", sizes=(2, H, 5, 6, 8, 8), mask=kind, grads=torch),
            Case("masked, Tq != Tk", sizes=(2, H, 7, 3, 8, 8), mask=kind),
            Case("masked, logits 1e4", sizes=(1, H, 4, 6, 16, 8), mask=kind, logit=1e4),
            # a mask applied by multiplication (masked logits 0) drowns kept logits this low
            Case("masked, logits -1e3", sizes=(1, H, 4, 6, 16, 8), mask=kind, logit=-1e3),
            Case("fully masked row", sizes=(2, H, 4, 5, 8, 8),
                 mask="lens-empty" if mask == "lens" else "empty"),
        ]
        if mask == "lens" and per_query:
            cases += [Case("per-query lengths", sizes=(2, H, 4, 5, 8, 8), mask="lens-2d",
                           grads=torch),
                      Case("per-query lengths, a query with none", sizes=(2, H, 4, 5, 8, 8),
                           mask="lens-2d-empty")]
    if causal:
        cases += [Case("causal", sizes=(1, H, 5, 5, 8, 8), causal=True, grads=torch),
                  Case("causal, Tq < Tk", sizes=(1, H, 3, 7, 8, 8), causal=True),
                  Case("causal, Tq > Tk", sizes=(1, H, 7, 4, 8, 8), causal=True)]
    if not torch:  # a PyTorch function may fairly refuse float64 (a kernel)
        cases.insert(1, Case("float64", dtype="float64", sizes=(2, H, 5, 5, 8, 8)))
    halves = ("float16", "bfloat16") if torch else ("float16",)
    for dtype in halves:
        cases.append(Case(dtype, dtype=dtype, sizes=(2, H, 5, 7, 8, 8)))
        if mask is not None:
            cases.append(Case(f"{dtype}, fully masked row", dtype=dtype,
                              sizes=(2, H, 4, 5, 8, 8),
                              mask="lens-empty" if mask == "lens" else "empty"))
    return cases


def softmax_cases(torch: bool) -> list[Case]:
    """``check_softmax``: ``x`` is ``sizes[:4]`` read as ``(B, H, Tq, Tk)``."""
    cases = [
        Case("basic", sizes=(2, 0, 3, 5, 0, 0), grads=torch),
        Case("4-D", sizes=(2, 3, 4, 7, 0, 0)),
        Case("length 1", sizes=(3, 0, 2, 1, 0, 0)),
        Case("length 97", sizes=(2, 0, 3, 97, 0, 0), grads=torch),
        Case("logits 1e3", sizes=(2, 0, 3, 6, 0, 0), logit=1e3),
        Case("logits 1e4", sizes=(2, 0, 3, 6, 0, 0), logit=1e4, grads=torch),
        Case("logits -1e4", sizes=(2, 0, 3, 6, 0, 0), logit=-1e4),
        Case("rows of different scale", sizes=(2, 0, 3, 6, 0, 0), logit=1e3, spread=True),
    ]
    if not torch:
        cases.insert(1, Case("float64", dtype="float64", sizes=(2, 0, 3, 5, 0, 0)))
    for dtype in ("float16", "bfloat16") if torch else ("float16",):
        cases.append(Case(dtype, dtype=dtype, sizes=(2, 0, 3, 9, 0, 0)))
    return cases


def masked_softmax_cases(lens: bool, torch: bool, per_query: bool = False) -> list[Case]:
    """``check_masked_softmax``: ``x`` is ``(B, Tq, Tk)``, as d2l's ``masked_softmax``;
    ``per_query`` (with ``lens``): also d2l's per-query lengths ``(B, Tq)``."""
    kind, empty = ("lens", "lens-empty") if lens else ("random", "empty")
    cases = [
        Case("masked", sizes=(2, 0, 3, 5, 0, 0), mask=kind, grads=torch),
        Case("length 97", sizes=(2, 0, 4, 97, 0, 0), mask=kind),
        Case("logits 1e3", sizes=(2, 0, 3, 6, 0, 0), mask=kind, logit=1e3),
        Case("logits 1e4", sizes=(2, 0, 3, 6, 0, 0), mask=kind, logit=1e4, grads=torch),
        Case("rows of different scale", sizes=(2, 0, 3, 6, 0, 0), mask=kind, logit=1e3,
             spread=True),
        # a mask applied by multiplication (masked logits 0) drowns kept logits this low
        Case("logits -1e3", sizes=(2, 0, 3, 6, 0, 0), mask=kind, logit=-1e3),
        Case("fully masked row", sizes=(2, 0, 3, 5, 0, 0), mask=empty),
    ]
    if lens and per_query:
        cases += [Case("per-query lengths", sizes=(2, 0, 4, 5, 0, 0), mask="lens-2d",
                       grads=torch),
                  Case("per-query lengths, a query with none", sizes=(2, 0, 4, 5, 0, 0),
                       mask="lens-2d-empty")]
    if not torch:
        cases.insert(1, Case("float64", dtype="float64", sizes=(2, 0, 3, 5, 0, 0), mask=kind))
    for dtype in ("float16", "bfloat16") if torch else ("float16",):
        cases.append(Case(dtype, dtype=dtype, sizes=(2, 0, 3, 9, 0, 0), mask=kind))
        cases.append(Case(f"{dtype}, fully masked row", dtype=dtype, sizes=(2, 0, 3, 5, 0, 0),
                          mask=empty))
    return cases
