"""``check_block(factory)``: a user's pre-norm Transformer block (GPT-2, Llama), judged by
what any such block must do, whatever its attention and MLP are made of.

A pre-norm block is ``x + attn(norm1(x))`` then ``x + mlp(norm2(x))``: the residual path
carries ``x`` through untouched, and each sublayer reads a normalised copy of it. Built
at width 16 with 4 heads (as :func:`~attnkit.check.check_multi_head` builds) and called
``m(x)`` on ``x (2, 6, 16)``, it is checked for:

- a call that raises (``call-failed``), an output that is not ``(B, T, E)`` (``shape``),
  non-finite outputs (``nan-or-inf``);
- ``causal-leak`` when declared causal: changing ``x`` at positions 3 and 4 moves the
  outputs at 0..2;
- with every parameter outside its norm layers set to 0, both sublayers give 0, so the
  block must return ``x`` itself. A block that returns ``x`` normalised instead (each row
  as a LayerNorm or an RMSNorm leaves it) normalises after the residual add: ``post-norm``,
  the original Transformer's layout. One that returns anything else, or whose output
  minus ``x`` grows with the size of ``x`` (a sublayer that reads ``x`` without its norm),
  has another residual path: ``residual``.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Iterator
from typing import Any

from ..catalogue import T as Tx
from ..core.report import Finding, Report
from ..core.spine import follow
from ..meet.build import build_module
from ..meet.targets import target_spec

__all__ = ["BlockCheck", "check_block"]

B, T, E, H = 2, 6, 16, 4


def check_block(factory: Any, causal: bool = True) -> Report:
    """Judge the pre-norm Transformer block that ``factory`` builds.

    Args:
        factory: a class (built at width 16 with 4 heads from its constructor's parameter
            names, as :func:`~attnkit.check.check_multi_head` does), a factory function
            ``factory(16, 4)``, or an instance 16 wide. ``forward(x)``: ``(B, T, E)`` ->
            ``(B, T, E)``.
        causal: the block is meant to be causal (a GPT's): one whose early outputs change
            with later inputs gets ``causal-leak``.

    Returns:
        A :class:`~attnkit.check.Report` (``check="block"``); a constructor or a call that
        raises is ``call-failed``, never a traceback.
    """
    spec = target_spec(factory)
    name = getattr(factory, "__qualname__", None) or type(factory).__name__
    report = Report("block", spec or name, framework="torch", convention="none",
                    layout="(B, T, E)")
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            follow(BlockCheck(factory, causal, report, spec))
        except (Exception, SystemExit) as err:  # the user's module may raise anything
            report.stopped(err, Tx("report.running-block"))
    report.seconds = time.perf_counter() - t0
    return report


class BlockCheck:
    """A pre-norm block along the spine (:mod:`attnkit.check.core.spine`): **prepare**
    builds it (a constructor that raises stops the check, as any error of the module does)
    and makes ``x``; the cases are the call on ``x`` (shape, finite outputs, causality; a
    wrong shape or a non-finite output ends the check) and the residual path.

    Args:
        factory: a class, factory function or instance (see :func:`check_block`).
        causal: the block is declared causal.
        report: the report written into.
        spec: where ``factory`` can be loaded from, or None.
    """

    def __init__(self, factory: Any, causal: bool, report: Report, spec: str | None) -> None:
        self.factory, self.causal, self.report, self.spec = factory, causal, report, spec
        self.m: Any = None
        self.x: Any = None  # (B, T, E)
        self.ended = False  # the call on x cannot be judged further

    def prepare(self) -> bool:
        import torch

        built = build_module(self.factory, E, H, self.spec)
        self.report.origin = built.how
        self.m = built.obj.eval()
        self.x = torch.randn(B, T, E, generator=torch.Generator().manual_seed(0))
        return True

    def cases(self) -> Iterator[str]:
        """``"call"``, then ``"residual"`` unless the call's output cannot be judged."""
        yield "call"
        if not self.ended:
            yield "residual"

    def judge(self, case: str) -> Iterator[Finding]:
        if case == "residual":  # its findings name their own cases (zeroed, scaled)
            yield from _residual_path(self.m, self.x)
            return
        import torch

        report, m, x = self.report, self.m, self.x
        report.cases.append(Tx("case.block-x", shape=tuple(x.shape)))
        with torch.no_grad():
            y = _out(m(x))
        if tuple(y.shape) != (B, T, E):
            self.ended = True
            yield Finding("shape", Tx("block.shape", shape=tuple(y.shape), want=(B, T, E)),
                          Tx("measured.shape", shape=tuple(y.shape), want=(B, T, E)),
                          report.cases[-1])
            return
        if not torch.isfinite(y).all():
            self.ended = True
            yield Finding("nan-or-inf", Tx("block.nan-or-inf"),
                          Tx("measured.non-finite-output"), report.cases[-1])
            return
        behaves_causal = _causal(m, x)
        report.causality = Tx("header.behaves-causal" if behaves_causal
                              else "header.bidirectional")
        if self.causal:
            report.causality += Tx("header.declared")
            if not behaves_causal:
                yield Finding("causal-leak", Tx("block.causal-leak"),
                              Tx("measured.early-moved"), report.cases[-1])

    def reproduce(self, case: str, verdict: Finding) -> str:
        """No reproducer: a block's findings say what to change in words (``""``)."""
        return ""

    def finish(self) -> None:
        """Nothing: each case's findings stand alone."""


def _out(result: Any) -> Any:
    """The output tensor of a call that may return ``(out, weights)``."""
    return result[0] if isinstance(result, (tuple, list)) else result


def _causal(m: Any, x: Any) -> bool:
    import torch

    y = x.clone()
    y[:, 3:] += 2 * torch.randn(B, T - 3, E, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = _out(m(x)), _out(m(y))
    return bool(torch.allclose(a[:, :3], b[:, :3], atol=1e-5))


def _is_norm(module: Any) -> bool:
    return "norm" in type(module).__name__.lower()


def _norms(x: Any) -> list[Any]:
    """``x`` normalised per row as a LayerNorm does (mean 0, standard deviation 1) and as an
    RMSNorm does (root mean square 1), both without their (untouched, unit) weights."""
    centred = x - x.mean(-1, keepdim=True)
    return [centred / centred.pow(2).mean(-1, keepdim=True).sqrt(),
            x / x.pow(2).mean(-1, keepdim=True).sqrt()]


def _residual_path(m: Any, x: Any) -> list[Finding]:
    """The findings of the two residual probes (module ``m``, input ``x``)."""
    import torch

    zeroed = copy.deepcopy(m)
    with torch.no_grad():
        for module in zeroed.modules():
            if not _is_norm(module):
                for p in module.parameters(recurse=False):
                    p.zero_()
        z = _out(zeroed(x))
    case = Tx("case.block-zeroed", shape=tuple(x.shape))
    if not torch.allclose(z, x, atol=1e-5):
        normalised = any(torch.allclose(z, n, atol=1e-3) for n in _norms(x))
        if normalised:
            return [Finding("post-norm", Tx("block.post-norm"), Tx("measured.returned-norm"),
                            case)]
        return [Finding("residual", Tx("block.replaces"),
                        Tx("measured.max-from-x", value=float((z - x).abs().max())), case)]
    with torch.no_grad():  # pre-norm: block(c x) - c x does not grow with c
        small = _out(m(x)) - x
        large = _out(m(100 * x)) - 100 * x
    growth = float(large.norm() / small.norm().clamp_min(1e-12))
    if growth > 10:
        return [Finding("residual", Tx("block.unnormed"), Tx("measured.growth", value=growth),
                        Tx("case.block-scaled"))]
    return []
