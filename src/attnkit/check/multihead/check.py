"""``check_multi_head(factory)``: a user's multi-head attention module, judged by what any
correct one must do, since its projections are its own.

The module is built at width 16 with 4 heads: a class from its constructor's parameter
names (:mod:`attnkit.check.meet.build`), a factory as ``factory(16, 4)``; an instance is used as
it is. A constructor or a first call that raises is ``call-failed``; every probe that needs a
second module builds one again rather than deep-copying a module that has run. The module
is called ``m(x)`` when ``forward`` takes one input (``m(x, mask=...)`` with a mask), else
``m(query, key, value[, mask])``, by name where the names say which is which. What is
checked, smallest evidence first:

- every tensor that trains is registered (``unregistered-parameter``: a plain list of
  ``nn.Linear``), and every registered parameter gets a gradient (``no-gradient``);
- output shape ``(B, Tq, E)`` for ``Tq != Tk`` both ways (``shape``); finite output at
  logits ~1e3 and ~1e4 (``nan-or-inf``); nothing written into the inputs (``mutates-input``);
- each query's output depends only on its own query and the keys/values, for
  ``m(query, key, value)`` (``mixes-queries``: heads split or merged without the transpose;
  the mask probes are then skipped, since they would blame the mask for the same bug);
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

from ..core.judge import first_line
from ..core.report import Finding, Report
from ..meet.adapt import (
    CONVENTIONS,
    LENS_NAMES,
    PADDING_NAMES,
    Call,
    origin_of,
    read_call,
    target_spec,
)
from ..meet.build import BuildError, build_module

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
    """Judge the multi-head attention module that ``factory`` builds.

    Args:
        factory: a class (built at width 16 with 4 heads from its constructor's parameter
            names, see :mod:`attnkit.check.meet.build`), a factory function
            (``factory(16, 4)``, or by parameter names), or an instance.
        convention: how the mask argument reads: ``"auto"`` (``valid_lens`` by name, a
            mask's polarity from behaviour), ``"valid_lens"``, ``"masked"`` (True = masked,
            as ``nn.MultiheadAttention``'s ``attn_mask``), ``"keep"`` (True = may attend),
            ``"additive"`` (a float mask added to the scores: 0 or ``finfo.min``),
            ``"none"`` (no mask).
        causal: the module is meant to be causal: one whose outputs at early positions
            change with later inputs gets ``causal-leak``. Either way, the report says
            whether a self-attention module behaves as causal.

    Returns:
        A :class:`Report` (see :mod:`attnkit.check.multihead.check` for what is checked). Whatever
        the module does, a report: a constructor or a call that raises is ``call-failed``.
    """
    if convention not in CONVENTIONS or convention == "sdpa":
        raise ValueError(f"convention must be one of auto, valid_lens, masked, keep, additive, "
                         f"none; got {convention!r}")
    spec = target_spec(factory)
    name = getattr(factory, "__qualname__", None) or type(factory).__name__
    report = Report("multi-head", spec or name)
    t0 = time.perf_counter()
    # The module may overflow on the cases: its warnings are findings here.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            _check_multi_head(factory, convention, causal, report, spec, name)
        except ValueError as err:
            if "takes no mask argument" in str(err):
                raise  # --convention does not fit the module: a bad argument
            report.stopped(err, "the module")
        except (Exception, SystemExit) as err:  # the user's module may raise anything
            report.stopped(err, "the module")
    report.seconds = time.perf_counter() - t0
    return report



def _failed_call(err: BaseException, what: str, fix: str) -> Finding:
    return Finding("call-failed", f"{what} raised {type(err).__name__}: {first_line(err)}; "
                   f"{fix}", type(err).__name__)


def _check_multi_head(factory: Any, convention: str, causal: bool, report: Report,
                      spec: str | None, name: str) -> None:
    import torch
    from torch import nn

    from .gradients import (  # torch: imported here
        dropout,
        dropout_knobs,
        gradients,
        half_precision,
        state_dict,
    )
    from .masks import mask_polarity, mask_probes
    from .positions import causal_leak, causality, mixes_queries
    from .probe import SHAPES, B, E, Harness, NoMaskLayout, T

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
    self_only, call = _signature(m)
    mask_name = call.mask_name
    h = Harness(built, m, spec, name, self_only, mask_name, call.input_names)
    h.mask_optional = call.mask_default
    h.prefer_key_only = (mask_name or "").lower() in PADDING_NAMES
    # Every probe but the dropout one runs on a fresh module with its dropout at 0, so that
    # a dropout bug shows as dropout-in-eval only. Fresh modules are built again (or copied
    # without the tensors a forward left on them), never deep-copied while in use.
    h.m = h.fresh()
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
                found = mask_polarity(h)
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
            pass  # the first call below says what the module raises
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
        if no_layout is not None:  # it needs a mask, and none of the layouts fitted
            add([no_layout], "masks: the mask layouts tried")
            return
        args = "m(x)" if self_only else "m(query, key, value)"
        mask = f" (a mask goes as {mask_name}=)" if mask_name and conv != "none" else ""
        report.add(_failed_call(
            err, f"calling the module as {args} on {(B, T, E)} inputs{mask}",
            "check that forward takes the inputs positionally or by the names "
            "query/key/value; declare the mask with --convention (none if forward's extra "
            "argument is not a mask), or write a factory that wraps the module"))
        return
    # Tokens mixed by the heads' split or merge: the mask probes would blame the mask (a
    # polarity no reading explains, masked keys that leak, an averaged empty row) for the
    # same bug, so they are not run, and a mask layout not found for it is not reported.
    mixing = [] if self_only else mixes_queries(h)
    if mixing and no_layout is not None and convention == "auto":
        no_layout = None
        report.convention = "none (masks not tested: the queries' outputs mix)"
    causal_findings: list[Finding] | None = None
    if self_only or causal:
        behaves = causality(h)
        if behaves is not None:
            report.causality = ("behaves as causal: later positions do not change earlier "
                                "outputs" if behaves else
                                "bidirectional: later positions change earlier outputs")
            causal_findings = []
            if causal:
                report.causality += " (declared causal)"
                if not behaves:
                    causal_findings.append(causal_leak(h))
    unregistered = h.unregistered() if is_module else []
    if is_module:
        add(unregistered, "registration: every trained tensor is a registered parameter")
    if no_layout is not None:
        add([no_layout], "masks: the mask layouts tried")
    if causal_findings is not None:
        add(causal_findings, "causality: do changes at positions 3, 4 move outputs 0..2?")
    add(h.shapes(), "shapes: Tq == Tk" if self_only else "shapes: Tq == Tk, Tq < Tk, Tq > Tk")
    if h.broken:
        return
    if not self_only:
        add(mixing, "queries independent: does changing query 4 move outputs 0..3?")
    add(h.large_logits(), "logits ~1e3 and ~1e4 (inputs scaled by 30 and 100)")
    if mixing:
        # Tokens mixed by the heads' split or merge also leak masked keys and averaged
        # rows: the mask probes would blame the mask for the same bug.
        report.cases.append("masks: not tested, the queries' outputs mix (mixes-queries)")
    elif conv != "none":
        try:
            found = mask_probes(h)
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
            add(half_precision(h, dtype), f"{dtype} copy of the module")
    add(gradients(h, finite_differences=not lost),
        "gradients: every parameter gets one; float64 central differences")
    h.m = built.obj
    add(dropout(h), "eval(): dropout off (dropout set to 0.5 where the module has it)")


def _tried(factory: Any) -> str:
    try:
        return f" {getattr(factory, '__name__', 'factory')}{inspect.signature(factory)}"
    except (TypeError, ValueError):
        return ""
