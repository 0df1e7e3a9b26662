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
  block must return ``x`` itself. A block that returns ``x`` normalised instead (every
  row mean 0 and standard deviation 1) normalises after the residual add: ``post-norm``,
  the original Transformer's layout. One that returns anything else, or whose output
  minus ``x`` grows with the size of ``x`` (a sublayer that reads ``x`` without its norm),
  has another residual path: ``residual``.
"""

from __future__ import annotations

import copy
import time
import warnings
from typing import Any

from ..core.report import Finding, Report
from ..meet.build import build_module
from ..meet.targets import target_spec

__all__ = ["check_block"]

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
            _check_block(factory, causal, report, spec)
        except (Exception, SystemExit) as err:  # the user's module may raise anything
            report.stopped(err, "the block")
    report.seconds = time.perf_counter() - t0
    return report


def _check_block(factory: Any, causal: bool, report: Report, spec: str | None) -> None:
    import torch

    built = build_module(factory, E, H, spec)
    report.origin = built.how
    m = built.obj.eval()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, E, generator=gen)
    report.cases.append(f"float32 x {tuple(x.shape)}")
    with torch.no_grad():
        y = _out(m(x))
    if tuple(y.shape) != (B, T, E):
        report.add(Finding("shape", f"the block returned {tuple(y.shape)} for x of shape "
                           f"{(B, T, E)}; a block keeps the shape of its input",
                           f"{tuple(y.shape)}", report.cases[-1]))
        return
    if not torch.isfinite(y).all():
        report.add(Finding("nan-or-inf", "the block's output holds NaN or inf on "
                           "float32 inputs of size ~1", "non-finite output", report.cases[-1]))
        return
    behaves_causal = _causal(m, x)
    report.causality = ("behaves as causal: later positions do not change earlier outputs"
                        if behaves_causal
                        else "bidirectional: later positions change earlier outputs")
    if causal:
        report.causality += " (declared causal)"
        if not behaves_causal:
            report.add(Finding(
                "causal-leak", "declared causal, the block lets position i see later "
                "positions: changing x at positions 3 and 4 changes the outputs at 0..2 "
                "(its attention needs causal=True, or the causal mask on its scores)",
                "outputs at positions 0..2 moved", report.cases[-1]))
    for finding in _residual_path(m, x):
        report.add(finding)


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
    case = f"float32 x {tuple(x.shape)}, every weight outside the norms set to 0"
    if not torch.allclose(z, x, atol=1e-5):
        mean, std = z.mean(-1), z.std(-1, unbiased=False)
        normalised = bool(torch.allclose(mean, torch.zeros(()), atol=1e-4)
                          and torch.allclose(std, torch.ones(()), atol=1e-3))
        if normalised:
            return [Finding(
                "post-norm", "the block normalises after the residual add (post-norm: "
                "norm(x + attn(x))); pre-norm was asked: x = x + attn(norm1(x)), then "
                "x = x + mlp(norm2(x)), so x itself passes through the block un-normalised",
                "with both sublayers giving 0 the block returned norm(x), not x", case)]
        return [Finding(
            "residual", "with both sublayers giving 0 the block should return x itself; "
            "it does not: a sublayer's output replaces x instead of being added to it "
            "(write x = x + attn(norm1(x)) and x = x + mlp(norm2(x)))",
            f"max |block(x) - x| {float((z - x).abs().max()):.3g}", case)]
    with torch.no_grad():  # pre-norm: block(c x) - c x does not grow with c
        small = _out(m(x)) - x
        large = _out(m(100 * x)) - 100 * x
    growth = float(large.norm() / small.norm().clamp_min(1e-12))
    if growth > 10:
        return [Finding(
            "residual", "block(c x) - c x grows with c: a sublayer reads x without its "
            "norm (pre-norm feeds each sublayer norm(x): attn(norm1(x)), mlp(norm2(x)))",
            f"|block(100 x) - 100 x| / |block(x) - x| = {growth:.3g}",
            "float32 x and 100 x")]
    return []
