"""Reproducers: a few lines of Python that, run as printed, show the bug.

Each one makes the case's inputs with the very source the checker ran, calls the function
as the checker did, computes the oracle, prints both, and ends in an ``assert`` that fails
while the bug is there (or in the function's own exception). Once the bug is fixed, the
same lines run clean: they double as a regression test.

A reproducer is a :class:`~attnkit.check.catalogue.Text`: its code is the same in every
language, and what a learner reads in it (a comment, a printed label, an assertion's
message) is a sentence of the catalogue (``repro.*``), written in the report's language
(:func:`~attnkit.check.catalogue.note`, ``quoted``, ``said``, re-exported here).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..catalogue import Text, join, note, quoted, said

__all__ = ["function_reproducer", "note", "quoted", "said"]


LENS_KINDS = ("lens", "lens-empty", "lens-2d", "lens-2d-empty")  # d2l's valid_lens




def _oracle_text(run: Any, case: Any, keep_expr: str = "keep", scale: str = "",
                 grads: bool = False) -> tuple[str, str]:
    """``(import line, expression)`` of the oracle's answer for ``case``."""
    t = run.t
    causal = "True" if t.causal else ""
    if keep_expr in ("no-causal", "top-left"):  # a declared-causal function, read otherwise
        causal, keep_expr = ("" if keep_expr == "no-causal" else "'top_left'"), "keep"
    if t.check == "attention":
        if case.mask in LENS_KINDS:
            opts = ", valid_lens=valid_lens"
        elif case.mask or case.causal:
            opts = f", mask={keep_expr}"
        else:
            opts = ""
        opts += f", causal={causal}" if causal else ""
        opts += f", scale={scale}" if scale else ""
        opts += ", d_out=d_out" if grads else ""
        return ("from attnkit.testing import reference_attention",
                f"reference_attention(Q, K, V{opts})")
    x64 = t.framework.to_float64_text("X")
    # Imported under another name: the function checked is often called softmax itself,
    # and ``fn = softmax`` after the import would then run attnkit's.
    if t.check == "softmax":
        return ("from attnkit.numpy import softmax as reference_softmax",
                f"reference_softmax({x64})")
    opts = "valid_lens" if case.mask in LENS_KINDS else f"mask={keep_expr}"
    return ("from attnkit.numpy import masked_softmax as reference_masked_softmax",
            f"reference_masked_softmax({x64}, {opts})")


def function_reproducer(run: Any, case: Any, verdict: Any) -> Text:
    """The reproducer of ``verdict``, found on ``case`` by ``run`` (a ``functions._Run``):
    the case's inputs, then the lines that show the finding (:func:`_gradient_lines` for a
    ``gradient``, else :func:`_output_lines`)."""
    t = run.t
    grads = verdict.code == "gradient"
    imp, oracle = _oracle_text(run, case, grads=grads and t.check == "attention")
    # The cotangent is drawn last, so leaving it out changes no other input.
    lines = t.header(imp) + [run.setup(replace(case, grads=grads))]
    lines += t.convert_lines(case.dtype, grad=grads)
    arrays = run.arrays(case)
    show = _gradient_lines if grads else _output_lines
    return join(lines + show(run, case, verdict, oracle, arrays), "line")


def _gradient_lines(run: Any, case: Any, verdict: Any, oracle: str, arrays: Any) -> list:
    """Backward through fn and the gradient the finding names against the oracle's (or
    fn's output with no ``grad_fn``)."""
    t, d = run.t, verdict.detail
    want = oracle + (".out" if t.check == "attention" else "")
    lines = t.got_lines(arrays, case.causal, case.dtype)[:-1]
    cot = "d_out" if t.check == "attention" else "d_y"
    if d.get("grad") is None:
        return lines + ["assert out.grad_fn is not None, " + quoted(verdict.message),
                        f"out.backward(torch.from_numpy({cot}).to(out.dtype))"]
    name = d["grad"]
    lines.append(f"out.backward(torch.from_numpy({cot}).to(out.dtype))")
    if t.check == "attention":
        lines.append(note(f"want = {oracle}.d{name}", "repro.oracle-grad"))
    else:
        lines += [f"y = {want}",
                  note("want = y * (d_y - (y * d_y).sum(-1, keepdims=True))",
                       "repro.softmax-backward")]
    return lines + [f"got = {name.upper()}.grad.double().numpy()",
                    "err = np.abs(got - want).max()",
                    "print(" + said("repro.grad-error", name=name) + ", err)",
                    f"assert err <= {d.get('bound', 1e-5):.3g}, " + quoted(verdict.message)]


def _output_lines(run: Any, case: Any, verdict: Any, oracle: str, arrays: Any) -> list:
    """fn's output against the oracle's, with the assertion that fits the finding."""
    t, fw = run.t, run.fw
    code, d = verdict.code, verdict.detail
    big = [n.upper() for n in t.inputs]
    equal = "torch.equal" if fw.name == "torch" else "np.array_equal"
    tail = ".out" if t.check == "attention" else ""
    lines: list = [note(f"want = {oracle}{tail}", "repro.oracle")]
    if code == "mutates-input":
        lines.append(f"before = [a.{'clone' if fw.name == 'torch' else 'copy'}() "
                     f"for a in ({', '.join(big)}{',' if len(big) == 1 else ''})]")
    lines += t.got_lines(arrays, case.causal, case.dtype)
    if code == "mutates-input":
        lines.append(f"changed = [n for n, a, b in zip({t.inputs!r}, ({', '.join(big)}"
                     f"{',' if len(big) == 1 else ''}), before) if not {equal}(a, b)]")
        lines.append("assert not changed, f" + said("repro.wrote-into", changed="{changed}"))
    elif code == "shape":
        lines.append("assert got.shape == want.shape, f" + said(
            "repro.shape", got="{got.shape}", want="{want.shape}"))
    elif code in ("nan-or-inf", "float16-overflow"):
        lines += ["print(got)", "assert np.isfinite(got).all(), " + quoted(verdict.message)]
    elif code == "fully-masked-row":
        empty = ("valid_lens == 0" if case.mask == "lens-empty"
                 else "(valid_lens == 0)[..., None].repeat(got.shape[-1], -1)"
                 if case.mask == "lens-2d-empty" and t.check != "attention"
                 else "valid_lens == 0" if case.mask == "lens-2d-empty"
                 else "~keep.any(-1)" if t.check == "attention"
                 else "~keep.any(-1, keepdims=True).repeat(keep.shape[-1], -1)")
        lines += [note(f"empty = {empty}", "repro.no-allowed-key"),
                  "print(got[empty])",
                  "assert np.abs(got[empty]).max() <= 1e-6, " + quoted(verdict.message)]
    else:
        lines += _reading_lines(run, case, code, d, tail)
        lines += ["err = np.abs(got - want).max()",
                  "print(" + said("repro.max-error") + ", err)",
                  note("if got.size <= 64:", "repro.small-enough"),
                  "    print(" + said("repro.label-fn") + ", np.round(got, 4).tolist())",
                  "    print(" + said("repro.label-oracle") + ", np.round(want, 4).tolist())",
                  f"assert err <= {d.get('bound', 1e-5):.3g}, " + quoted(verdict.message)]
    return lines


def _reading_lines(run: Any, case: Any, code: str, d: dict, tail: str) -> list[Text]:
    """The line that prints fn's error against the other reading that explains the finding
    (another scale, the mask inverted, no causal mask, top-left causal), if any."""
    t = run.t
    if code == "wrong-scale":
        _, alt = _oracle_text(run, case, scale=repr(d["scale"]))
        return ["print(" + said("repro.error-scale", scale=f"{d['scale']:.4g}")
                + f", np.abs(got - {alt}{tail}).max())"]
    if code == "mask-polarity" and case.mask:
        _, alt = _oracle_text(run, case, keep_expr="~keep")
        return ["print(" + said("repro.error-inverted") + f", np.abs(got - {alt}{tail}).max())"]
    if code == "causal-leak" and "moved" not in d:
        _, alt = _oracle_text(run, case, keep_expr="no-causal")
        return ["print(" + said("repro.error-no-causal") + f", np.abs(got - {alt}{tail}).max())"]
    if code == "causal-alignment":
        _, alt = _oracle_text(run, case, keep_expr="top-left" if t.causal
                              else "np.tril(np.ones_like(keep))")
        return ["print(" + said("repro.error-top-left") + f", np.abs(got - {alt}{tail}).max())"]
    return []
