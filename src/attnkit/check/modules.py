"""``check_multi_head(factory)``: a user's multi-head attention module, judged by what any
correct one must do, since its projections are its own.

``factory(embed_dim, num_heads)`` builds the module (an ``nn.Module``; the module is called
``m(x)`` when ``forward`` takes one input, else ``m(query, key, value[, mask])``). What is
checked, smallest evidence first:

- every tensor that trains is registered (``unregistered-parameter``: a plain list of
  ``nn.Linear``), and every registered parameter gets a gradient (``no-gradient``);
- output shape ``(B, Tq, E)`` for ``Tq != Tk`` both ways (``shape``); finite output at
  logits ~1e3 and ~1e4 (``nan-or-inf``); nothing written into the inputs (``mutates-input``);
- masks: values at masked keys change nothing (else ``mask-polarity`` when the other
  reading holds), a query with no allowed key does not average the values
  (``fully-masked-row``, a warning; NaN is ``nan-or-inf``);
- float16/bfloat16 copies run and stay finite where float32 does (``float16-overflow``);
- gradients of inputs and parameters agree with float64 central differences of the module
  itself (``gradient``);
- ``state_dict`` round-trips (``state-dict``); ``eval()`` turns dropout off
  (``dropout-in-eval``).
"""

from __future__ import annotations

import copy
import inspect
import time
import warnings
from typing import Any

import numpy as np

from .adapt import CONVENTIONS, LENS_NAMES, PADDING_NAMES, Call, read_call, target_spec
from .report import Finding, Report

__all__ = ["check_multi_head"]


def _signature(m: Any) -> tuple[bool, Call]:
    """``(self_attention_only, how forward is called)``: ``m(x[, mask=...])`` when forward
    takes one required input besides its mask and flags, else ``m(query, key, value, ...)``
    (by name when the names say which is which)."""
    fn = m.forward if hasattr(m, "forward") else m
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False, Call(guessed=None)
    qkv = read_call(m, 3)
    if qkv.input_names:
        return False, qkv
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    inputs = positional or [p for p in params if p.kind == p.KEYWORD_ONLY]
    required = [p for p in inputs if p.default is inspect.Parameter.empty
                and "mask" not in p.name.lower() and p.name.lower() not in LENS_NAMES]
    self_only = len(required) == 1 or len(inputs) == 1
    if not self_only:
        return False, qkv
    return True, read_call(m, 1)


def _no_layout(h: Any, tried: str) -> Finding:
    return Finding("call-failed", f"the module's {h.mask_name}= took none of the mask layouts "
                   f"the check knows, so masks were not tested; declare the mask with "
                   f"--convention, or wrap the module in a factory whose forward takes a "
                   f"(B, Tq, Tk) mask", f"tried {tried}")


def check_multi_head(factory: Any, convention: str = "auto", causal: bool = False) -> Report:
    """Judge the multi-head attention module that ``factory(embed_dim, num_heads)`` builds.

    Args:
        factory: a class or function; ``factory(16, 4)`` must build the module.
        convention: how the mask argument reads: ``"auto"`` (``valid_lens`` by name, a
            mask's polarity from behaviour), ``"valid_lens"``, ``"masked"`` (True = masked,
            as ``nn.MultiheadAttention``'s ``attn_mask``), ``"keep"`` (True = may attend),
            ``"additive"`` (a float mask added to the scores: 0 or ``finfo.min``),
            ``"none"`` (no mask).
        causal: the module is meant to be causal: one whose outputs at early positions
            change with later inputs gets ``causal-leak``. Either way, the report says
            whether a self-attention module behaves as causal.

    Returns:
        A :class:`Report` (see :mod:`attnkit.check.modules` for what is checked).
    """
    # The module may overflow on the cases: its warnings are findings here.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return _check_multi_head(factory, convention, causal)


def _check_multi_head(factory: Any, convention: str, causal: bool) -> Report:
    t0 = time.perf_counter()
    if convention not in CONVENTIONS or convention == "sdpa":
        raise ValueError(f"convention must be one of auto, valid_lens, masked, keep, additive, "
                         f"none; "
                         f"got {convention!r}")
    import torch
    from torch import nn

    from .mhagrads import dropout, dropout_knobs, gradients, state_dict  # torch: imported here
    from .mhaprobe import SHAPES, Harness, NoMaskLayout

    spec = target_spec(factory)
    name = getattr(factory, "__qualname__", None) or type(factory).__name__
    torch.manual_seed(0)
    m = factory(16, 4)
    is_module = isinstance(m, nn.Module)
    if not (is_module or callable(m)):
        raise TypeError(f"factory(16, 4) built {type(m).__name__}, which cannot be called")
    report = Report("multi-head", spec or name, framework="torch" if is_module else "numpy")
    self_only, call = _signature(m)
    mask_name = call.mask_name
    h = Harness(factory, m, spec, name, self_only, mask_name, call.input_names)
    h.mask_optional = call.mask_default
    h.prefer_key_only = (mask_name or "").lower() in PADDING_NAMES
    # Every probe but the dropout one runs on a copy with its dropout at 0, so that a
    # dropout bug shows as dropout-in-eval only.
    h.m = copy.deepcopy(m)
    dropout_knobs(h.m, 0.0)
    h.find_batch_first()
    conv, how = convention, "declared"
    no_layout: Finding | None = None
    if convention == "auto":
        if mask_name is None:
            conv, how = "none", "from the signature"
        elif call.guessed in ("valid_lens", "masked"):
            conv, how = call.guessed, "from the signature"
        else:
            try:
                found = h.polarity()
            except NoMaskLayout as err:
                found, no_layout = None, _no_layout(h, str(err))
            conv, how = (found, "from behaviour") if found else ("keep", "assumed")
    elif conv != "none" and mask_name is None:
        raise ValueError(f"--convention {conv}: the module's forward takes no mask argument "
                         f"(no parameter named mask, attn_mask, valid_lens...)")
    h.convention = conv
    if no_layout is None and conv in ("masked", "keep", "additive") and h.layout is None:
        try:
            keep = torch.ones(5, 5, dtype=torch.bool)
            keep[:, 3:] = False
            h.call(h.eval(h.m), torch.randn(2, 5, 16), keep=keep)
        except NoMaskLayout as err:
            no_layout = _no_layout(h, str(err))
        except Exception:
            pass  # the shape probe says what the module raises
    if no_layout is not None:
        h.convention = conv = "none"  # the mask probes cannot run
        how = f"{mask_name}= took no known layout: masks not tested"
    report.convention = f"{conv} ({how})" + (f", passed as {mask_name}=" if conv != "none"
                                            and mask_name else "")
    if h.layout:
        report.convention += f" {SHAPES[h.layout]}"
    report.layout = ("(B, T, E)" if h.batch_first else "(T, B, E)") + (
        ", self-attention m(x)" if self_only else "")
    if call.input_names:
        report.layout += ", inputs by name " + "=, ".join(call.input_names) + "="
    if not hasattr(m, "batch_first"):
        report.layout += " (found by trying)" if not h.batch_first else ""
    causal_findings: list[Finding] | None = None
    if self_only or causal:
        behaves = h.causality()
        if behaves is not None:
            report.causality = ("behaves as causal: later positions do not change earlier "
                                "outputs" if behaves else
                                "bidirectional: later positions change earlier outputs")
            causal_findings = []
            if causal:
                report.causality += " (declared causal)"
                if not behaves:
                    causal_findings.append(h.causal_leak())

    def add(found: list[Finding], case: str) -> None:
        report.cases.append(case)
        for f in found:
            f.case = f.case or case
            report.add(f)

    unregistered = h.unregistered() if is_module else []
    if is_module:
        add(unregistered, "registration: every trained tensor is a registered parameter")
    if no_layout is not None:
        add([no_layout], "masks: the mask layouts tried")
    if causal_findings is not None:
        add(causal_findings, "causality: do changes at positions 3, 4 move outputs 0..2?")
    add(h.shapes(), "shapes: Tq == Tk" if self_only else "shapes: Tq == Tk, Tq < Tk, Tq > Tk")
    if h.broken:
        report.seconds = time.perf_counter() - t0
        return report
    add(h.large_logits(), "logits ~1e3 and ~1e4 (inputs scaled by 30 and 100)")
    if conv != "none":
        add(h.masks(), "masked keys change nothing; a query with no allowed key")
    if not is_module:  # a NumPy class: no dtype moves, autograd or state_dict to check
        h.m = m
        add(dropout(h), "the same call twice gives the same output")
        report.seconds = time.perf_counter() - t0
        return report
    # .half()/.double() and state_dict miss unregistered tensors and plain tensor
    # attributes: what follows from those is not reported twice.
    lost = bool(unregistered)
    if not lost:
        found = state_dict(h)
        add(found, "state_dict round trip into a fresh module")
        lost = bool(found)
    if not lost:
        for dtype in ("float16", "bfloat16"):
            add(h.half(dtype), f"{dtype} copy of the module")
    add(gradients(h, finite_differences=not lost),
        "gradients: every parameter gets one; float64 central differences")
    h.m = m
    add(dropout(h), "eval(): dropout off (dropout set to 0.5 where the module has it)")
    report.seconds = time.perf_counter() - t0
    return report

