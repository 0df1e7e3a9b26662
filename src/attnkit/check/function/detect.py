"""What the function checks find out about a function before its cases run, by calling it.

- :func:`probe`: NumPy or PyTorch, and (attention) the layout: ``(B, H, T, D)``,
  ``(B, T, D)``, or ``(B, T, H, D)`` (heads on axis 2, as JAX and flash-attn take them),
  and an output laid out ``(B, Tq, H, Dv)``;
- :func:`mask_layout`: a mask with a flag per query and key, or one flag per key
  (``(B, Tk)``, a key padding mask);
- :func:`mask_convention`: which keys a mask whose name does not say its polarity ignores;
- :func:`behaves_causal`: whether later keys change earlier queries' outputs.

Each one only names a convention: whether the numbers are right is the cases' business.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any

import numpy as np

from ..core.cases import Case
from ..core.judge import Run
from ..core.report import T, Text, first_line
from ..meet.adapt import PADDING_NAMES, Call, Framework, unwrap
from ..meet.calls import Target

__all__ = ["behaves_causal", "mask_convention", "mask_layout", "probe", "probe_case"]

_LAYOUT_NAMES = {"bhtd": "(B, H, T, D)", "btd": "(B, T, D)", "bthd": "(B, T, H, D)"}


def _output(run: Run, result: Any) -> np.ndarray | None:
    """``fn``'s output as float64 in the oracle's layout, or None when it is not one."""
    try:
        out = run.t.output(result)[0]
        return run.fw.float64(out) if run.fw.is_result(out) else None
    except Exception:
        return None


def _heads_apart(run: Run, a: dict, case: Case, got: np.ndarray) -> bool:
    """Changing head 0's keys and values changes head 0's output only: ``fn`` reads the
    head axis where the target puts it. (Read on the wrong axis, head 0 is a key position
    of every head, and every output moves.) It holds whatever the numbers' bugs."""
    g = np.random.default_rng(5)
    b = dict(a)
    for name in ("k", "v"):
        b[name] = a[name].copy()
        b[name][:, 0] += 2 * g.standard_normal(a[name][:, 0].shape)
    result, error, _ = run.call(b, case, "float32")
    moved = None if error is not None else _output(run, result)
    if moved is None or moved.shape != got.shape:
        return False
    change = np.abs(np.nan_to_num(moved) - np.nan_to_num(got))
    return bool(change[:, 0].max() > 1e-3 and change[:, 1:].max() <= 1e-5)


def probe(fn: Any, check: str, convention: str | None, call: Call, spec: str | None,
          name: str, causal: bool, load: str = "",
          attempts: list | None = None) -> tuple[Target | None, list[Text]]:
    """Find the framework (and, for attention, the layout) ``fn`` runs with.

    Args:
        attempts: if given, each try that failed is appended to it as ``(target,
            exception or None, expected output shape)``, in the order of ``errors``.

    Returns:
        ``(target, errors)``: the target (None when no try worked) and one line per try
        that failed.
    """
    frameworks = ["numpy"] + (["torch"] if importlib.util.find_spec("torch") else [])
    errors: list[Text] = []
    layouts = ("bhtd", "btd", "bthd") if check == "attention" else ("bhtd",)
    padding = (call.mask_name or "").lower() in PADDING_NAMES
    keyed = [padding]
    if check == "attention" and call.mask_name and not call.mask_default \
            and convention in (None, "masked", "keep", "additive"):
        keyed.append(not padding)  # a required mask: its layout may be what fails
    for fw_name in frameworks:
        fw = Framework(fw_name)
        for layout in layouts:
            for per_key in keyed:
                t = Target(fn, check, fw, convention or "keep", layout != "btd",
                           call.mask_default, spec, name, load=load, call=call, causal=causal,
                           in_layout="bthd" if layout == "bthd" else "bhtd", mask_keys=per_key)
                label: Any = fw_name if check != "attention" else (
                    T("try.layout-per-key", fw=fw_name, layout=_LAYOUT_NAMES[layout])
                    if per_key else f"{fw_name} {_LAYOUT_NAMES[layout]}")
                found = _try(t, layout, label, errors, attempts)
                if found is not None:
                    return found, errors
    return None, errors


def probe_case(t: Target) -> Case:
    """The inputs :func:`probe` calls ``t`` with (and a reproducer of a failed try)."""
    mask = None
    if t.check == "masked-softmax":
        mask = "lens" if t.convention == "valid_lens" else "random"
    # H, Tq and Dk differ, so that each layout reads the arrays another way
    sizes = (2, 3 if t.heads else 0, 4, 4, 8, 8) if t.check == "attention" else (2, 0, 3, 4, 0, 0)
    return Case("probe", sizes=sizes, mask=mask)


def _try(t: Target, layout: str, label: Any, errors: list[Text],
         attempts: list | None = None) -> Target | None:
    """``t`` (or the same read as ``(B, T, H, D)``) when ``fn`` runs in its layout; else
    None, and the reason appended to ``errors`` (and ``attempts``)."""
    case = probe_case(t)
    run = Run(t)
    a = run.arrays(case)
    result, error, _ = run.call(a, case, "float32")
    attempts = [] if attempts is None else attempts
    if error is not None:
        errors.append(T("try.raised", label=label,
                        error=f"{type(error).__name__}: {first_line(error)}"))
        attempts.append((t, error, None))
        return None
    out = unwrap(result)[0]
    if not t.framework.is_result(out):
        errors.append(T("try.returned", label=label, type=type(out).__name__))
        attempts.append((t, None, None))
        return None
    want_shape = run.want(a, run.keep(a))["out"].shape
    flipped = (want_shape[0], want_shape[2], want_shape[1], want_shape[3]) \
        if t.heads and t.check == "attention" else None
    if tuple(out.shape) == want_shape and layout != "bthd":
        if layout == "bhtd" and t.check == "attention":
            # (B, T, H, D) inputs read as (B, H, T, D) give the same shape out: behaviour
            # says which reading fn follows.
            got = _output(run, result)
            if got is None or not _heads_apart(run, a, case, got):
                other = _heads_on_axis_2(run, a, case)
                if other is not None:
                    return other
        return t
    if flipped is not None and tuple(out.shape) == flipped:
        t.out_layout = "bthd"  # (B, Tq, H, Dv): transformers' eager attention
        return t
    errors.append(T("try.output-shape", label=label, shape=tuple(out.shape),
                    want=flipped if layout == "bthd" else want_shape))
    attempts.append((t, None, flipped if layout == "bthd" else want_shape))
    return None


def _heads_on_axis_2(run: Run, a: dict, case: Case) -> Target | None:
    """The target read as ``(B, T, H, D)`` in and out, when its output then fits."""
    t = replace(run.t, in_layout="bthd", out_layout="bthd")
    other = Run(t)
    result, error, _ = other.call(a, case, "float32")
    got = None if error is not None else _output(other, result)
    return t if got is not None and _heads_apart(other, a, case, got) else None


def mask_layout(run: Run, convention: str | None, call: Call) -> None:
    """Set ``run.t.mask_keys`` (and ``heads``) to the mask layout ``fn`` takes.

    A mask with a flag per query and key is tried first, then one flag per key ``(B, Tk)``;
    the other way round for a parameter named as a padding mask. A per-key mask written
    for ``(B, T, D)`` inputs is tried with them. When none works, nothing changes (the
    cases will say what goes wrong)."""
    t = run.t
    if t.check != "attention" or convention not in (None, "masked", "keep", "additive"):
        return
    padding = (call.mask_name or "").lower() in PADDING_NAMES
    orders = (True, False) if padding else (False, True)
    tries = [(t.heads, per_key) for per_key in orders]
    if t.heads and t.in_layout == "bhtd":
        tries += [(False, per_key) for per_key in orders]
    start = (t.heads, t.mask_keys)
    for heads, per_key in tries:
        t.heads, t.mask_keys = heads, per_key
        case = Case("probe", sizes=(2, 3 if heads else 0, 4, 5, 8, 8), mask="random",
                    per_key=per_key)
        a = run.arrays(case)
        result, error, _ = run.call(a, case, "float32")
        got = None if error is not None else _output(run, result)
        if got is not None and got.shape == run.want(a, run.keep(a))["out"].shape:
            return
    t.heads, t.mask_keys = start


def mask_convention(run: Run) -> str | None:
    """``"masked"``, ``"keep"`` or ``"additive"``: which reading of a mask does ``fn``
    follow? None when none holds.

    Keys 3 and 4 of every row are flagged. For each reading, the keys it says ``fn``
    ignores get random changes, a different one per key (to q/k/v's keys and values, or to
    a softmax's scores): a function that ignores them gives the same output. (Changing
    them all by one amount would not do: a softmax over those keys cannot see it.)
    """
    t = run.t
    a = run.arrays(Case("probe", sizes=(2, 3 if t.heads else 0, 4, 5, 8, 8)
                        if t.check == "attention" else (2, 0, 4, 5, 0, 0)))
    x = a["q"] if "q" in a else a["x"]
    flag = np.zeros(x.shape[:-1] + (5,), dtype=bool)
    flag[..., 3:] = True
    g = np.random.default_rng(7)
    for reading, ignored in (("masked", flag), ("keep", ~flag), ("additive", flag)):
        t.convention = "additive" if reading == "additive" else "keep"  # the flag as it is
        outs = []
        for change in (0.0, 1.0):
            mask = ~flag if reading == "additive" else flag
            b = dict(a, keep=mask, keep_keys=mask[(slice(None),) + (0,) * (mask.ndim - 2)])
            if t.check == "attention":
                at_key = ignored[..., 0, :, None]
                b["k"] = a["k"] + change * at_key * 2 * g.standard_normal(a["k"].shape)
                b["v"] = a["v"] + change * at_key * 2 * g.standard_normal(a["v"].shape)
            else:
                b["x"] = a["x"] + change * ignored * 2 * g.standard_normal(a["x"].shape)
            result, error, _ = run.call(b, Case("probe"), "float32")
            if error is not None:
                break
            try:
                outs.append(run.fw.float64(t.output(result)[0]))
            except Exception:
                break
        if len(outs) == 2 and np.isfinite(outs[0]).all() and outs[0].shape == outs[1].shape \
                and np.allclose(outs[0], outs[1], atol=1e-5):
            return reading
    return None


def behaves_causal(run: Run) -> bool:
    """Changing the last keys (and their values) leaves the earlier queries' outputs as they
    are and moves the last ones: ``fn`` masks the future itself.

    Tq == Tk here, where causal attention aligned top-left and bottom-right agree (the
    cases tell them apart: ``causal-alignment``)."""
    t = run.t
    case = Case("probe", sizes=(2, 3 if t.heads else 0, 5, 5, 8, 8))
    a = run.arrays(case)
    late = np.zeros(a["k"].shape[:-1] + (1,), dtype=bool)
    late[..., 3:, :] = True  # keys 3 and 4; queries 0..2 may not see them
    g = np.random.default_rng(11)
    outs = []
    for change in (0.0, 1.0):
        b = dict(a, k=a["k"] + change * late * 2 * g.standard_normal(a["k"].shape),
                 v=a["v"] + change * late * 2 * g.standard_normal(a["v"].shape))
        result, error, _ = run.call(b, case, "float32")
        got = None if error is not None else _output(run, result)
        if got is None or not np.isfinite(got).all():
            return False
        outs.append(got)
    if outs[0].shape != outs[1].shape or outs[0].ndim < 2:
        return False
    early, later = outs[0][..., :3, :], outs[1][..., :3, :]
    moved = np.abs(outs[0][..., 3:, :] - outs[1][..., 3:, :]).max()
    return bool(np.allclose(early, later, atol=1e-5) and moved > 1e-3)
