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
import re
import time
import warnings
from typing import Any

import numpy as np

from ..catalogue import T as Tx
from ..catalogue import Text, join
from ..core.judge import first_line
from ..core.report import Finding, Report
from ..core.where import failing_line
from ..meet.adapt import (
    CONVENTIONS,
    LENS_NAMES,
    PADDING_NAMES,
    QKV_NAMES,
    Call,
    origin_of,
    read_call,
    target_spec,
)
from ..meet.build import BuildError, BuildRaised, build_module
from .oracle_words import say

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
    if qkv.input_names or _names_qkv(params):
        # forward(query, key=None, value=None): self-attention by default, cross-attention
        # when key and value are given; called with all three, key is never a mask
        return False, qkv
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    inputs = positional or [p for p in params if p.kind == p.KEYWORD_ONLY]
    required = [p for p in inputs if p.default is inspect.Parameter.empty
                and "mask" not in p.name.lower() and p.name.lower() not in LENS_NAMES]
    self_only = len(required) == 1 or len(inputs) == 1
    if not self_only:
        return False, qkv
    return True, read_call(m, 1)


def _names_qkv(params: list[inspect.Parameter]) -> bool:
    """The first three parameters are named as query, key and value (any of their
    spellings), the last two perhaps with a default."""
    names = tuple(p.name.lower() for p in params[:3])
    return any(names == triple for triple in QKV_NAMES)


def _no_layout(h: Any, tried: Text) -> Finding:
    """``call-failed`` for a mask no layout fits: the first try and the line it failed on,
    the factory to write, and a reproducer that makes the first try again."""
    from .probe import B, T  # torch: imported here

    items = tried.fields.get("items") if isinstance(tried, Text) else None
    first = items[0] if items else tried
    expr = re.sub(r"=4\b", "=H", re.sub(r"=16\b", "=E", h.built.expr or f"{h.name}(E, H)"))
    inputs = "x" if h.self_only else "query, key, value"
    factory = (f"class Checked(torch.nn.Module): def __init__(self, E, H): super().__init__(); "
               f"self.inner = {expr}; def forward(self, {inputs}, mask=None): return "
               f"self.inner({inputs}, {h.mask_name}=...)  # from mask (B, Tq, Tk), True = "
               f"may attend, make the mask it asserts")
    key_only = h.prefer_key_only or h.convention == "valid_lens"
    shape = f"{B}, {T}" if key_only else f"{B}, {T}, {T}"
    fill = "zeros" if h.convention == "masked" else "ones"
    mask = (f"torch.full(({B},), {T})" if h.convention == "valid_lens"
            else f"torch.{fill}({shape}, dtype=torch.bool)  # nothing masked")
    return Finding("call-failed", Tx("mha.no-mask-layout", name=h.mask_name, first=first,
                                     factory=factory),
                   Tx("measured.tried-layouts", tries=tried),
                   reproducer=h.repro([f"mask = {mask}",
                                       f"out = run({h.args_text('x')}, {h.mask_name}=mask)"]))


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
            report.stopped(err, Tx("report.running-module"))
        except (Exception, SystemExit) as err:  # the user's module may raise anything
            report.stopped(err, Tx("report.running-module"))
    report.seconds = time.perf_counter() - t0
    return report



def _failed_call(err: BaseException, what: Text, fix: Text) -> Finding:
    where = failing_line(err)  # the line of the user's code that raised
    error = f"{type(err).__name__}: {first_line(err)}"
    return Finding("call-failed", Tx("mha.raised-at", what=what, error=error, where=where,
                                     fix=fix) if where else
                   Tx("mha.raised", what=what, error=error, fix=fix),
                   Tx("measured.raised", name=type(err).__name__))


def _check_multi_head(factory: Any, convention: str, causal: bool, report: Report,
                      spec: str | None, name: str) -> None:
    from torch import nn

    from .probe import Harness

    built = _build_target(factory, report, spec)
    if built is None:
        return
    m = built.obj
    report.framework = "torch" if isinstance(m, nn.Module) else "numpy"
    self_only, call = _signature(m)
    h = Harness(built, m, spec, name, self_only, call.mask_name, call.input_names)
    h.mask_optional = call.mask_default
    h.prefer_key_only = (call.mask_name or "").lower() in PADDING_NAMES
    # Every probe but the dropout one runs on a fresh module with its dropout at 0, so that
    # a dropout bug shows as dropout-in-eval only. Fresh modules are built again (or copied
    # without the tensors a forward left on them), never deep-copied while in use.
    from .gradients import dropout_knobs

    h.m = h.fresh()
    dropout_knobs(h.m, 0.0)
    h.find_batch_first()
    conv, how, no_layout = _convention(h, call, convention)
    _header(report, h, m, call, conv, how, no_layout)
    _probe(h, built, factory, report, call, causal, convention, no_layout)


def _build_target(factory: Any, report: Report, spec: str | None) -> Any:
    """The module built from ``factory`` (None, with the finding, when it cannot be)."""
    from .probe import E  # torch: imported here

    origin = origin_of(factory)
    report.origin = origin
    try:
        built = build_module(factory, E, 4, spec)
    except BuildError as err:
        report.add(Finding("call-failed", err.text, Tx("measured.not-built")))
        return None
    except BuildRaised as raised:
        report.add(_raised_building(raised, spec))
        return None
    except (Exception, SystemExit) as err:
        tried = _tried(factory)
        report.add(_failed_call(err, Tx("mha.building", tried=tried), Tx("mha.fix-factory")))
        return None
    report.origin = join([x for x in (origin, built.how) if x])
    if not callable(built.obj):
        report.add(Finding("call-failed", Tx("mha.gives-not-callable", how=built.how,
                                            type=type(built.obj).__name__),
                           Tx("measured.not-callable")))
        return None
    return built


def _convention(h: Any, call: Any, convention: str) -> tuple[str, str, Finding | None]:
    """The mask convention (declared, read off the signature or found by behaviour), how it
    was chosen, and the finding when no mask layout fits the module."""
    import torch

    from .masks import mask_polarity
    from .probe import NoMaskLayout

    mask_name = call.mask_name
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
                found, no_layout = None, _no_layout(h, err.args[0])
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
            no_layout = _no_layout(h, err.args[0])
        except Exception:
            pass  # the first call says what the module raises
    if no_layout is not None:
        h.convention = conv = "none"  # the mask probes cannot run
    return conv, how, no_layout


def _header(report: Report, h: Any, m: Any, call: Any, conv: str, how: str,
            no_layout: Finding | None) -> None:
    """The report's convention and layout lines."""
    from .probe import SHAPES

    mask_name = call.mask_name
    how_text = Tx("how.no-layout", name=mask_name) if no_layout is not None else Tx(f"how.{how}")
    report.convention = Tx("header.convention", name=conv, how=how_text)
    if conv != "none" and mask_name:
        report.convention += Tx("header.passed-as", name=mask_name)
    if h.layout:
        report.convention += f" {SHAPES[h.layout]}"
    report.layout = "(B, T, E)" if h.batch_first else "(T, B, E)"
    if h.self_only:
        report.layout += Tx("header.self-attention")
    if call.input_names:
        report.layout += Tx("header.by-name", names="=, ".join(call.input_names) + "=")
    if not hasattr(m, "batch_first") and not h.batch_first:
        report.layout += Tx("header.found-by-trying")


def _probe(h: Any, built: Any, factory: Any, report: Report, call: Any, causal: bool,
           convention: str, no_layout: Finding | None) -> None:
    """Every probe, in the order a reader fixes things: the call, the tokens, causality,
    registration, shapes, logits, the oracle, masks, then what needs a module's copies."""
    import torch
    from torch import nn

    from .masks import mask_probes
    from .positions import causal_leak, causality, mixes_queries
    from .probe import B, E, T

    self_only, mask_name, conv = h.self_only, call.mask_name, h.convention
    is_module = isinstance(built.obj, nn.Module)

    def add(found: list[Finding], case: Text) -> None:
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
            add([no_layout], Tx("probe.mask-layouts"))
            return
        args = "m(x)" if self_only else "m(query, key, value)"
        what = (Tx("mha.calling-mask", call=args, shape=(B, T, E), name=mask_name)
                if mask_name and conv != "none" else
                Tx("mha.calling", call=args, shape=(B, T, E)))
        failed = _failed_call(err, what, Tx("mha.fix-call"))
        failed.reproducer = h.repro([f"out = run({h.args_text('x')})"
                                     f"  # raises {type(err).__name__}"])
        report.add(failed)
        return
    # Tokens mixed by the heads' split or merge: the mask probes would blame the mask (a
    # polarity no reading explains, masked keys that leak, an averaged empty row) for the
    # same bug, so they are not run, and a mask layout not found for it is not reported.
    mixing = [] if self_only else mixes_queries(h)
    if mixing and no_layout is not None and convention == "auto":
        no_layout = None
        report.convention = Tx("header.none-mixing")
    causal_findings: list[Finding] | None = None
    if self_only or causal:
        behaves = causality(h)
        if behaves is not None:
            report.causality = Tx("header.behaves-causal" if behaves
                                 else "header.bidirectional")
            causal_findings = []
            if causal:
                report.causality += Tx("header.declared")
                if not behaves:
                    causal_findings.append(causal_leak(h))
    unregistered = h.unregistered() if is_module else []
    if is_module:
        add(unregistered, Tx("probe.registration"))
    if no_layout is not None:
        add([no_layout], Tx("probe.mask-layouts"))
    if causal_findings is not None:
        add(causal_findings, Tx("probe.causality"))
    add(h.shapes(), Tx("probe.shapes-self" if self_only else "probe.shapes"))
    if h.broken:
        return
    if not self_only:
        add(mixing, Tx("probe.queries"))
    add(h.large_logits(), Tx("probe.logits"))
    _oracle(h, factory, report, is_module, mixing, add)
    if any(f.code == "mixes-queries" for f in report.findings):
        # Tokens mixed by the heads' merge also move earlier outputs with later inputs: one
        # bug, named once, by its cause.
        report.findings = [f for f in report.findings if f.code != "causal-leak"]
    if mixing:
        # Tokens mixed by the heads' split or merge also leak masked keys and averaged
        # rows: the mask probes would blame the mask for the same bug.
        report.cases.append(Tx("probe.masks-mixing"))
    elif conv != "none":
        try:
            found = mask_probes(h)
        except Exception as err:
            found = [_failed_call(err, Tx("mha.calling-with-mask"), Tx("mha.fix-mask"))]
        add(found, Tx("probe.masks"))
    _copies(h, built, is_module, bool(unregistered), add)


def _copies(h: Any, built: Any, is_module: bool, lost: bool, add: Any) -> None:
    """The probes on the module's copies and state: state_dict, half precision, gradients,
    dropout (a NumPy class has none of these but the dropout one)."""
    from .gradients import dropout, gradients, half_precision, state_dict

    if not is_module:  # a NumPy class: no dtype moves, autograd or state_dict to check
        h.m = built.obj
        add(dropout(h), Tx("probe.same-call"))
        return
    # .half()/.double() and state_dict miss unregistered tensors and plain tensor
    # attributes: what follows from those is not reported twice.
    if not lost:
        found = state_dict(h)
        add(found, Tx("probe.state-dict"))
        lost = bool(found)
    if not lost:
        for dtype in ("float16", "bfloat16"):
            add(half_precision(h, dtype), Tx("probe.half", dtype=dtype))
    add(gradients(h, finite_differences=not lost), Tx("probe.gradients"))
    h.m = built.obj
    add(dropout(h), Tx("probe.dropout"))


def _oracle(h: Any, factory: Any, report: Report, is_module: bool, mixing: list,
            add: Any) -> None:
    """Compare with the float64 oracle from the module's own weights
    (:mod:`attnkit.check.multihead.oracle`); its finding is left out where the queries'
    outputs mix, which already says what is wrong."""
    if not is_module:
        report.oracle = {"compared": False, "why": say("oracle.why-numpy")}
        return
    from .oracle import compare_with_oracle

    outcome = compare_with_oracle(h, factory)
    report.oracle = outcome.as_dict()
    if mixing and not (outcome.compared and outcome.finding is None):
        # The core was compared and cannot agree: mixes-queries says why.
        report.oracle = {"compared": True, "why": "", "structure": outcome.structure or
                         say("oracle.mixing")}
    if outcome.compared:
        found = [outcome.finding] if outcome.finding is not None and not mixing else []
        add(found, say("oracle.case"))


def _raised_building(raised: BuildRaised, spec: str | None) -> Finding:
    """``call-failed`` for a constructor that raised: the call, the line that failed, the
    factory to write, and a reproducer that makes the same call."""
    err = raised.error
    where = failing_line(err)
    file = (spec or "my_file.py:x").rsplit(":", 1)[0]
    error = f"{type(err).__name__}: {first_line(err)}"
    fix = Tx("mha.fix-factory-written", factory=raised.factory, file=file)
    what = Tx("mha.building-as", expr=raised.expr)
    return Finding(
        "call-failed", Tx("mha.raised-at", what=what, error=error, where=where, fix=fix)
        if where else Tx("mha.raised", what=what, error=error, fix=fix),
        Tx("measured.raised", name=type(err).__name__),
        reproducer="\n".join(["from attnkit.check import load_target", *raised.loads,
                              f"m = {raised.expr}  # raises {type(err).__name__}"]))


def _tried(factory: Any) -> str:
    try:
        return f" {getattr(factory, '__name__', 'factory')}{inspect.signature(factory)}"
    except (TypeError, ValueError):
        return ""
