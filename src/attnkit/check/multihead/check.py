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

import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..catalogue import T as Tx
from ..catalogue import Text, UsageError
from ..core.report import Finding, Report
from ..core.repro import note
from ..core.spine import follow
from ..meet.adapt import CONVENTIONS, PADDING_NAMES, target_spec
from .flags import causal_flag
from .oracle_words import say
from .prepare import build_target, failed_call, find_convention, read_signature, write_header

__all__ = ["MultiHeadCheck", "check_multi_head"]


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
        raise UsageError(Tx("mha.convention-choices", got=repr(convention)))
    spec = target_spec(factory)
    name = getattr(factory, "__qualname__", None) or type(factory).__name__
    report = Report("multi-head", spec or name)
    # not compared until the oracle probe runs: a module that cannot be built or called,
    # or whose shapes end the check, was never compared
    report.oracle = {"compared": False, "why": say("oracle.why-not-reached")}
    t0 = time.perf_counter()
    # The module may overflow on the cases: its warnings are findings here.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            follow(MultiHeadCheck(factory, convention, causal, report, spec, name))
        except ValueError as err:
            if "takes no mask argument" in str(err):
                raise  # --convention does not fit the module: a bad argument
            report.stopped(err, Tx("report.running-module"))
        except (Exception, SystemExit) as err:  # the user's module may raise anything
            report.stopped(err, Tx("report.running-module"))
    report.seconds = time.perf_counter() - t0
    return report


@dataclass
class Probe:
    """One case of the multi-head check: the words the report lists it by, and the probe
    that judges it (its findings; None when it compared nothing, so it is no case)."""

    text: Text
    run: Callable[[], list[Finding] | None]


class MultiHeadCheck:
    """A multi-head attention module along the spine (:mod:`attnkit.check.core.spine`).

    **prepare** builds the module, reads how ``forward`` is called, makes a fresh copy with
    its dropout at 0, finds batch-first, the mask convention and layout, writes the header,
    and makes the first call (one that raises ends the check: ``call-failed``); it also
    reads causality and, for ``m(query, key, value)``, whether queries mix, since the
    header says both. **cases** are the probes in the order a reader fixes things (each
    asked for after the one before was judged, since what it found decides what follows).
    **judge** runs one probe. **finish** names a bug once where two probes saw it.

    Args:
        factory: a class, factory function or instance (see :func:`check_multi_head`).
        convention: a name of :data:`CONVENTIONS` but ``"sdpa"``.
        causal: the module is declared causal.
        report: the report written into.
        spec: where ``factory`` can be loaded from (the reproducers import it), or None.
        name: ``factory``'s name in sentences.
    """

    def __init__(self, factory: Any, convention: str, causal: bool, report: Report,
                 spec: str | None, name: str) -> None:
        self.factory, self.convention, self.causal = factory, convention, causal
        self.report, self.spec, self.name = report, spec, name
        self.built: Any = None
        self.h: Any = None  # the Harness every probe runs through
        self.call: Any = None
        self.conv = convention
        self.is_module = False
        self.no_layout: Finding | None = None  # no mask layout fits the module
        self.mixing: list[Finding] = []  # mixes-queries, read before the cases
        self.causal_findings: list[Finding] | None = None  # None: causality not read
        self.lost = False  # a tensor that .half() and state_dict miss was found

    # -- prepare: meet the module --------------------------------------------------------------
    def prepare(self) -> bool:
        from torch import nn

        from .gradients import dropout_knobs
        from .probe import Harness

        report = self.report
        built = build_target(self.factory, report, self.spec, self.causal)
        if built is None:
            return False
        m = built.obj
        report.framework = "torch" if isinstance(m, nn.Module) else "numpy"
        self_only, call = read_signature(m)
        h = Harness(built, m, self.spec, self.name, self_only, call.mask_name, call.input_names)
        h.mask_optional = call.mask_default
        h.causal = self.causal
        flag = causal_flag(m) if self.causal and isinstance(m, nn.Module) else None
        if flag is not None:  # declared causal: forward's own switch is on in every call
            h.flags[flag] = True
        h.prefer_key_only = (call.mask_name or "").lower() in PADDING_NAMES
        # Every probe but the dropout one runs on a fresh module with its dropout at 0, so
        # that a dropout bug shows as dropout-in-eval only. Fresh modules are built again (or
        # copied without the tensors a forward left on them), never deep-copied while in use.
        h.m = h.fresh()
        dropout_knobs(h.m, 0.0)
        h.find_batch_first()
        conv, how, self.no_layout = find_convention(h, call, self.convention)
        write_header(report, h, m, call, conv, how, self.no_layout)
        self.built, self.h, self.call, self.conv = built, h, call, h.convention
        self.is_module = isinstance(built.obj, nn.Module)
        if not self._first_call():
            return False
        self._positions()
        return True

    def _first_call(self) -> bool:
        """The first call: a module that cannot be called at all is not a shape bug (False,
        with its finding)."""
        import torch

        from .probe import B, E, T

        h, report, mask_name = self.h, self.report, self.call.mask_name
        try:
            x = torch.randn(B, T, E, generator=torch.Generator().manual_seed(0))
            h.call(h.eval(h.m), x, None if h.self_only else x)
        except Exception as err:
            if self.no_layout is not None:  # it needs a mask, and none of the layouts fitted
                report.cases.append(Tx("probe.mask-layouts"))
                self.no_layout.case = self.no_layout.case or Tx("probe.mask-layouts")
                report.add(self.no_layout)
                return False
            args = "m(x)" if h.self_only else "m(query, key, value)"
            what = (Tx("mha.calling-mask", call=args, shape=(B, T, E), name=mask_name)
                    if mask_name and self.conv != "none" else
                    Tx("mha.calling", call=args, shape=(B, T, E)))
            failed = failed_call(err, what, Tx("mha.fix-call"))
            failed.reproducer = h.repro([note(f"out = run({h.args_text('x')})",
                                              "repro.raises-name", error=type(err).__name__)])
            report.add(failed)
            return False
        return True

    def _positions(self) -> None:
        """What the header says of positions: whether queries mix (``m(query, key,
        value)``) and whether the module behaves causal; their findings wait for their
        cases."""
        from .positions import causal_leak, causality, mixes_queries

        h, report = self.h, self.report
        # Tokens mixed by the heads' split or merge: the mask probes would blame the mask (a
        # polarity no reading explains, masked keys that leak, an averaged empty row) for the
        # same bug, so they are not run, and a mask layout not found for it is not reported.
        self.mixing = [] if h.self_only else mixes_queries(h)
        if self.mixing and self.no_layout is not None and self.convention == "auto":
            self.no_layout = None
            report.convention = Tx("header.none-mixing")
        if h.self_only or self.causal:
            behaves = causality(h)
            if behaves is not None:
                report.causality = Tx("header.behaves-causal" if behaves
                                      else "header.bidirectional")
                self.causal_findings = []
                if self.causal:
                    report.causality += Tx("header.declared")
                    for name in h.flags:
                        report.causality += Tx("header.flag-set", name=name)
                    if not behaves:
                        self.causal_findings.append(causal_leak(h))

    # -- cases ---------------------------------------------------------------------------------
    def cases(self) -> Iterator[Probe]:
        """The probes in the order a reader fixes things: registration, the mask layouts,
        causality, shapes (a broken module ends here), queries, logits, the oracle, masks,
        then what needs the module's copies (:meth:`_copies`)."""
        h = self.h
        if self.is_module:
            yield Probe(Tx("probe.registration"), self._registration)
        if self.no_layout is not None:
            yield Probe(Tx("probe.mask-layouts"), lambda: [self.no_layout])
        if self.causal_findings is not None:
            yield Probe(Tx("probe.causality"), lambda: self.causal_findings)
        yield Probe(Tx("probe.shapes-self" if h.self_only else "probe.shapes"), h.shapes)
        if h.broken:
            return
        if not h.self_only:
            yield Probe(Tx("probe.queries"), lambda: self.mixing)
        yield Probe(Tx("probe.logits"), h.large_logits)
        yield Probe(say("oracle.case"), self._oracle)
        if self.mixing:
            # Tokens mixed by the heads' split or merge also leak masked keys and averaged
            # rows: the mask probes would blame the mask for the same bug.
            yield Probe(Tx("probe.masks-mixing"), lambda: [])
        elif self.conv != "none":
            yield Probe(Tx("probe.masks"), self._masks)
        yield from self._copies()

    def _copies(self) -> Iterator[Probe]:
        """The probes on the module's copies and state: state_dict, half precision,
        gradients, dropout (a NumPy class has none of these but the dropout one)."""
        from .gradients import gradients, half_precision

        h = self.h
        if not self.is_module:  # a NumPy class: no dtype moves, autograd or state_dict
            yield Probe(Tx("probe.same-call"), self._dropout)
            return
        # .half()/.double() and state_dict miss unregistered tensors and plain tensor
        # attributes: what follows from those is not reported twice.
        if not self.lost:
            yield Probe(Tx("probe.state-dict"), self._state_dict)
        if not self.lost:
            for dtype in ("float16", "bfloat16"):
                yield Probe(Tx("probe.half", dtype=dtype),
                            lambda dtype=dtype: half_precision(h, dtype))
        yield Probe(Tx("probe.gradients"),
                    lambda: gradients(h, finite_differences=not self.lost))
        yield Probe(Tx("probe.dropout"), self._dropout)

    def _registration(self) -> list[Finding]:
        found = self.h.unregistered()
        self.lost = bool(found)
        return found

    def _state_dict(self) -> list[Finding]:
        from .gradients import state_dict

        found = state_dict(self.h)
        self.lost = bool(found)
        return found

    def _dropout(self) -> list[Finding]:
        from .gradients import dropout

        self.h.m = self.built.obj  # the module as built: its own dropout
        return dropout(self.h)

    def _masks(self) -> list[Finding]:
        from .masks import mask_probes

        try:
            return mask_probes(self.h)
        except Exception as err:
            return [failed_call(err, Tx("mha.calling-with-mask"), Tx("mha.fix-mask"))]

    def _oracle(self) -> list[Finding] | None:
        """Compare with the float64 oracle from the module's own weights
        (:mod:`attnkit.check.multihead.oracle`); its finding is left out where the queries'
        outputs mix, which already says what is wrong. None when nothing was compared."""
        report, mixing = self.report, self.mixing
        if not self.is_module:
            report.oracle = {"compared": False, "why": say("oracle.why-numpy")}
            return None
        from .oracle import compare_with_oracle

        outcome = compare_with_oracle(self.h, self.factory)
        report.oracle = outcome.as_dict()
        if mixing and not (outcome.compared and outcome.finding is None):
            # The core was compared and cannot agree: mixes-queries says why.
            report.oracle = {"compared": True, "why": "", "structure": outcome.structure or
                             say("oracle.mixing")}
        if not outcome.compared:
            return None
        return [outcome.finding] if outcome.finding is not None and not mixing else []

    # -- judge, reproduce, finish -----------------------------------------------------------
    def judge(self, case: Probe) -> Iterator[Finding]:
        # listed before it runs: a probe that raises stops the check, and the call-failed
        # finding names the last case listed as the one it stopped in
        self.report.cases.append(case.text)
        found = case.run()
        if found is None:  # nothing compared: not a case of the report
            self.report.cases.pop()
            return
        for f in found:
            f.case = f.case or case.text
            yield f

    def reproduce(self, case: Probe, verdict: Finding) -> str:
        """The reproducer of ``verdict``: each probe writes it as it finds the defect, from
        the inputs it made and the calls it ran (no case object could rebuild them)."""
        return verdict.reproducer

    def finish(self) -> None:
        if any(f.code == "mixes-queries" for f in self.report.findings):
            # Tokens mixed by the heads' merge also move earlier outputs with later inputs:
            # one bug, named once, by its cause.
            self.report.findings = [f for f in self.report.findings if f.code != "causal-leak"]
