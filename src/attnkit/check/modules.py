"""``check_multi_head(factory)``: a user's multi-head attention module, judged by what any
correct one must do, since its projections are its own.

The module is built at width 16 with 4 heads: a class from its constructor's parameter
names (:mod:`attnkit.check.build`), a factory as ``factory(16, 4)``; an instance is used as
it is. A constructor or a first call that raises is ``call-failed``; every probe that needs a
second module builds one again rather than deep-copying a module that has run. The module
is called ``m(x)`` when ``forward`` takes one input, else ``m(query, key, value[, mask])``.
What is checked, smallest evidence first:

- every tensor that trains is registered (``unregistered-parameter``: a plain list of
  ``nn.Linear``, seed 002), and every registered parameter gets a gradient (``no-gradient``);
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

import inspect
import time
import warnings
from typing import Any

import numpy as np

from .adapt import CONVENTIONS, LENS_NAMES, origin_of, target_spec
from .build import BuildError, build_module
from .judge import first_line
from .report import Finding, Report

__all__ = ["check_multi_head"]


def _signature(m: Any) -> tuple[bool, str | None, bool]:
    """``(self_attention_only, mask parameter name, the mask may be left out)`` of
    ``m.forward``."""
    try:
        params = list(inspect.signature(m.forward if hasattr(m, "forward") else m)
                      .parameters.values())
    except (TypeError, ValueError):
        return False, None, True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name for p in params]
    mask = next((n for n in names if n.lower() in LENS_NAMES), None)
    mask = mask or next((n for n in ("mask", "attn_mask") if n in names), None)
    mask = mask or next((n for n in names if "mask" in n.lower() and "padding" not in n), None)
    optional = mask is None or next(p for p in params if p.name == mask).default \
        is not inspect.Parameter.empty
    return len(positional) == 1, mask, optional


def check_multi_head(factory: Any, convention: str = "auto") -> Report:
    """Judge the multi-head attention module that ``factory`` builds.

    Args:
        factory: a class (built at width 16 with 4 heads from its constructor's parameter
            names, see :mod:`attnkit.check.build`), a factory function
            (``factory(16, 4)``, or by parameter names), or an instance.
        convention: how the mask argument reads: ``"auto"`` (``valid_lens`` by name, a
            mask's polarity from behaviour), ``"valid_lens"``, ``"masked"`` (True = masked,
            as ``nn.MultiheadAttention``'s ``attn_mask``), ``"keep"`` (True = may attend),
            ``"none"`` (no mask).

    Returns:
        A :class:`Report` (see :mod:`attnkit.check.modules` for what is checked). Whatever
        the module does, a report: a constructor or a call that raises is ``call-failed``.
    """
    if convention not in CONVENTIONS or convention == "sdpa":
        raise ValueError(f"convention must be one of auto, valid_lens, masked, keep, none; "
                         f"got {convention!r}")
    spec = target_spec(factory)
    name = getattr(factory, "__qualname__", None) or type(factory).__name__
    report = Report("multi-head", spec or name)
    t0 = time.perf_counter()
    # The module may overflow on the cases: its warnings are findings here.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            _check_multi_head(factory, convention, report, spec, name)
        except (Exception, SystemExit) as err:  # the user's module may raise anything
            report.add(Finding(
                "call-failed", f"the check stopped while running the module: "
                f"{type(err).__name__}: {first_line(err)}", type(err).__name__,
                case=report.cases[-1] if report.cases else ""))
    report.seconds = time.perf_counter() - t0
    return report


def _failed_call(err: BaseException, what: str, fix: str) -> Finding:
    return Finding("call-failed", f"{what} raised {type(err).__name__}: {first_line(err)}; "
                   f"{fix}", type(err).__name__)


def _check_multi_head(factory: Any, convention: str, report: Report, spec: str | None,
                      name: str) -> None:
    import torch
    from torch import nn

    from .mhagrads import dropout, dropout_knobs, gradients, state_dict  # torch: imported here
    from .mhaprobe import B, E, Harness, T

    origin = origin_of(factory)
    report.origin = origin
    try:
        built = build_module(factory, E, 4, spec)
    except BuildError as err:
        report.add(Finding("call-failed", str(err), "not built"))
        return
    except (Exception, SystemExit) as err:
        tried = _tried(factory)
        report.add(_failed_call(err, f"building the module{tried}",
                                "if the arguments are wrong for it, write a factory: "
                                "def make(E, H): return YourClass(...) and check file.py:make"))
        return
    report.origin = "; ".join(x for x in (origin, built.how) if x)
    m = built.obj
    is_module = isinstance(m, nn.Module)
    if not callable(m):
        report.add(Finding("call-failed", f"{built.how} gives a {type(m).__name__}, which "
                           f"cannot be called: pass the class, an instance or a factory "
                           f"that returns the module", "not callable"))
        return
    report.framework = "torch" if is_module else "numpy"
    self_only, mask_name, optional = _signature(m)
    h = Harness(built, m, spec, name, self_only, mask_name)
    h.mask_optional = optional
    # Every probe but the dropout one runs on a fresh module with its dropout at 0, so that
    # a dropout bug shows as dropout-in-eval only. Fresh modules are built again (or copied
    # without the tensors a forward left on them), never deep-copied while in use.
    h.m = h.fresh()
    dropout_knobs(h.m, 0.0)
    conv, how = convention, "declared"
    if convention == "auto":
        if mask_name is None:
            conv, how = "none", "from the signature"
        elif mask_name.lower() in LENS_NAMES:
            conv, how = "valid_lens", "from the signature"
        else:
            found = h.polarity()
            conv, how = (found, "from behaviour") if found else ("keep", "assumed")
    h.convention = conv
    report.convention = f"{conv} ({how})" + (f", passed as {mask_name}=" if conv != "none"
                                            and mask_name else "")
    report.layout = ("(B, T, E)" if h.batch_first else "(T, B, E)") + (
        ", self-attention m(x)" if self_only else "")

    def add(found: list[Finding], case: str) -> None:
        report.cases.append(case)
        for f in found:
            f.case = f.case or case
            report.add(f)

    # The first call: a module that cannot be called at all is not a shape bug.
    try:
        x = torch.randn(B, T, E, generator=torch.Generator().manual_seed(0))
        h.call(h.eval(h.m), x, None if self_only else x)
    except Exception as err:
        args = "m(x)" if self_only else "m(query, key, value)"
        mask = f" (a mask goes as {mask_name}=)" if mask_name and conv != "none" else ""
        report.add(_failed_call(
            err, f"calling the module as {args} on {(B, T, E)} inputs{mask}",
            "check that forward takes the inputs positionally, batch first; declare the "
            "mask with --convention (none if forward's extra argument is not a mask), or "
            "write a factory that wraps the module"))
        return
    unregistered = h.unregistered() if is_module else []
    if is_module:
        add(unregistered, "registration: every trained tensor is a registered parameter")
    add(h.shapes(), "shapes: Tq == Tk, Tq < Tk, Tq > Tk")
    if h.broken:
        return
    add(h.large_logits(), "logits ~1e3 and ~1e4 (inputs scaled by 30 and 100)")
    if conv != "none":
        try:
            found = h.masks()
        except Exception as err:
            found = [_failed_call(err, "calling the module with a mask",
                                  "declare how it reads its mask with --convention "
                                  "(none if it takes no attention mask)")]
        add(found, "masked keys change nothing; a query with no allowed key")
    if not is_module:  # a NumPy class: no dtype moves, autograd or state_dict to check
        h.m = built.obj
        add(dropout(h), "the same call twice gives the same output")
        return
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
    h.m = built.obj
    add(dropout(h), "eval(): dropout off (dropout set to 0.5 where the module has it)")


def _tried(factory: Any) -> str:
    try:
        return f" {getattr(factory, '__name__', 'factory')}{inspect.signature(factory)}"
    except (TypeError, ValueError):
        return ""
