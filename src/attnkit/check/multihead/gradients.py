"""The probes of ``check_multi_head`` that need copies of the module: gradients (every
parameter gets one; they agree with float64 central differences), the ``state_dict`` round
trip, dropout under ``eval()``, and float16/bfloat16 copies (``half_precision``). Each takes
the :class:`attnkit.check.multihead.probe.Harness`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..catalogue import T as Tx
from ..core.overflow import overflow_cause
from ..core.report import Finding, first_line
from ..core.repro import note, quoted, said

__all__ = ["dropout", "dropout_knobs", "gradients", "half_precision", "state_dict"]

B, E, T = 2, 16, 5


def dropout_knobs(m: nn.Module, p: float) -> list[str]:
    """Set every dropout probability of ``m`` to ``p``: ``nn.Dropout`` submodules and float
    attributes named like a dropout (``dropout``, ``dropout_p``, ``attn_dropout``...).
    Returns the assignments, as code on ``m``."""
    done = []
    if not isinstance(m, nn.Module):  # a NumPy class: its own attributes only
        for attr, value in list(vars(m).items()):
            if "drop" in attr.lower() and isinstance(value, float) and not attr.startswith("_"):
                setattr(m, attr, p)
                done.append(f"m.{attr} = {p}")
        return done
    for path, mod in m.named_modules():
        prefix = f"m.{path}." if path else "m."
        if isinstance(mod, nn.modules.dropout._DropoutNd):
            mod.p = p
            done.append(f"{prefix}p = {p}")
            continue
        for attr, value in list(vars(mod).items()):
            if "drop" in attr.lower() and isinstance(value, float) and not attr.startswith("_"):
                setattr(mod, attr, p)
                done.append(f"{prefix}{attr} = {p}")
    return done


def _inputs(h: Any, dtype: torch.dtype, grad: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    n = 1 if h.self_only else 2
    return [torch.randn(B, T, E, generator=g, dtype=torch.float64).to(dtype).requires_grad_(grad)
            for _ in range(n)]


def gradients(h: Any, finite_differences: bool = True) -> list[Finding]:
    m = h.fresh().eval()
    dropout_knobs(m, 0.0)
    xs = _inputs(h, torch.float32, True)
    cot = torch.randn(B, T, E, generator=torch.Generator().manual_seed(4))
    out = h.call(m, *xs)
    try:
        (out * cot).sum().backward()
    except Exception as err:
        return [Finding("gradient", Tx("judge.backward-raises",
                                      error=f"{type(err).__name__}: {first_line(err)}"),
                        Tx("measured.raised", name=type(err).__name__))]
    found = []
    none = [n for n, p in m.named_parameters() if p.requires_grad and p.grad is None]
    if none:
        msg = Tx("mha.no-gradient", names=", ".join(none[:4]))
        found.append(Finding("no-gradient", msg, Tx("measured.grad-none-count", n=len(none)),
                             reproducer=h.repro([
                                 f"out = run({h.args_text('x')})", "out.sum().backward()",
                                 f"p = m.get_parameter({none[0]!r})",
                                 "assert p.grad is not None, " + quoted(msg)])))
    grads = [g for g in [x.grad for x in xs] + [p.grad for p in m.parameters()] if g is not None]
    if any(not torch.isfinite(g).all() for g in grads):
        found.append(Finding("gradient", Tx("mha.grad-non-finite"),
                             Tx("measured.grad-non-finite")))
        return found
    if not finite_differences or found:
        return found
    # The module's float64 gradient along one random direction, against central
    # differences of its own float64 forward: a hand-written backward that is wrong
    # disagrees by O(1); float64 differences agree to ~1e-8.
    m64 = h.fresh().eval().double()
    dropout_knobs(m64, 0.0)
    params = [p for p in m64.parameters() if p.requires_grad]
    xs64 = _inputs(h, torch.float64, True)
    g = torch.Generator().manual_seed(5)
    dirs_x = [torch.randn(x.shape, generator=g, dtype=torch.float64) for x in xs64]
    dirs_p = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params]
    cot64 = cot.double()
    try:
        (h.call(m64, *xs64) * cot64).sum().backward()
    except Exception:
        # a module that runs in float32 only (a float32 tensor made in forward meets the
        # float64 inputs): the differences are the check's own tool, not a call of the
        # user's, so they are skipped rather than reported as a call that failed
        return found
    analytic = sum(float((x.grad * d).sum()) for x, d in zip(xs64, dirs_x)
                   if x.grad is not None) + sum(
        float((p.grad * d).sum()) for p, d in zip(params, dirs_p) if p.grad is not None)
    # eps 1e-3: modules that keep softmax statistics in float32 (as they should for half
    # inputs) stay in float32 there even as .double() copies; their rounding is then
    # ~1e-7 / eps relative, far below the 1e-2 bound, while a wrong backward is off by O(1).
    # A kink (relu, abs, max) that a step of eps crosses makes the differences wrong, not the
    # backward: it is a finding only when a step ten times smaller disagrees too.

    def loss(sign: float, eps: float) -> float:
        with torch.no_grad():
            for p, d in zip(params, dirs_p):
                p.add_(sign * eps * d)
            try:
                xs_ = [(x + sign * eps * d).detach() for x, d in zip(xs64, dirs_x)]
                return float((h.call(m64, *xs_) * cot64).sum())
            finally:
                for p, d in zip(params, dirs_p):
                    p.sub_(sign * eps * d)

    for eps in (1e-3, 1e-4):
        numeric = (loss(1.0, eps) - loss(-1.0, eps)) / (2 * eps)
        rel = abs(analytic - numeric) / max(abs(numeric), 1e-6)
        if rel <= 1e-2:
            break
    else:
        found.append(Finding("gradient", Tx("mha.grad-differences"),
                             Tx("measured.directional", analytic=analytic, numeric=numeric,
                               rel=rel)))
    return found


def state_dict(h: Any) -> list[Finding]:
    m1 = h.fresh()
    with torch.no_grad():
        g = torch.Generator().manual_seed(7)
        for p in m1.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    m2 = h.fresh(seed=1)  # other initial values, which the state dict must overwrite
    try:
        m2.load_state_dict(m1.state_dict())
    except Exception as err:
        return [Finding("state-dict", Tx("mha.state-dict-load",
                                        error=f"{type(err).__name__}: {first_line(err, 150)}"),
                        Tx("measured.raised", name=type(err).__name__))]
    for m in (m1, m2):
        m.eval()
        dropout_knobs(m, 0.0)
    x = _inputs(h, torch.float32, False)
    a, b = h.call(m1, *x), h.call(m2, *x)
    if torch.allclose(a, b, atol=1e-6):
        return []
    saved = set(m1.state_dict())
    extra = [f"{path + '.' if path else ''}{attr}" for path, mod in m1.named_modules()
             for attr, v in vars(mod).items() if isinstance(v, torch.Tensor) and v.is_leaf
             and not attr.startswith("_") and f"{path + '.' if path else ''}{attr}" not in saved]
    msg = (Tx("mha.state-dict-plain", names=", ".join(extra[:4])) if extra
           else Tx("mha.state-dict"))
    again = h.built.expr or f"factory({h.built.args or '16, 4'})"  # a second one, built so
    return [Finding("state-dict", msg, Tx("measured.max-difference",
                                         value=float((a - b).detach().abs().max())),
                    reproducer=h.repro([
                        "with torch.no_grad():",
                        "    for p in m.parameters():",
                        note("        p.add_(0.1 * torch.randn_like(p))", "repro.as-if-trained"),
                        "torch.manual_seed(1)", f"m2 = {again}",
                        "m2.load_state_dict(m.state_dict())",
                        "m.eval(), m2.eval()",
                        f"a, b = run({h.args_text('x')}), m2({h.args_text('x')})",
                        "b = b[0] if isinstance(b, tuple) else b",
                        "assert torch.allclose(a, b), " + quoted(msg)]))]


def dropout(h: Any) -> list[Finding]:
    m = h.fresh()
    knobs = dropout_knobs(m, 0.5)
    h.eval(m)
    x = _inputs(h, torch.float32, False)
    seed, h.seed = h.seed, None  # two calls, two different draws
    try:
        torch.manual_seed(11)
        a = h.call(m, *x)
        torch.manual_seed(12)
        b = h.call(m, *x)
    finally:
        h.seed = seed
    m0 = h.fresh()
    dropout_knobs(m0, 0.0)
    c = h.call(h.eval(m0), *x)
    if torch.equal(a, b) and torch.allclose(a, c, atol=1e-6):
        return []
    msg = Tx("mha.dropout-in-eval")
    code = "dropout-in-eval"
    if h.numpy:  # no eval() to call: randomness in every call
        code = "nondeterministic"
        msg = Tx("mha.nondeterministic")
    return [Finding(code, msg,
                    Tx("measured.eval-differ", value=float((a - b).detach().abs().max())),
                    reproducer=h.repro(knobs + ([] if h.numpy else ["m.eval()"]) + [
                        f"a, b = run({h.args_text('x')}), run({h.args_text('x')})",
                        "assert torch.equal(a, b), " + quoted(msg)], dropout=True))]


def half_precision(h: Any, dtype: str) -> list[Finding]:
    """A float16/bfloat16 copy of the module runs and stays finite where float32 does
    (``float16-overflow``)."""
    m16 = h.fresh()
    dropout_knobs(m16, 0.0)
    m16 = m16.to(getattr(torch, dtype)).eval()
    x = torch.randn(B, T, E, generator=torch.Generator().manual_seed(0)).to(getattr(torch, dtype))
    keep = torch.ones(T, T, dtype=torch.bool)
    keep[0] = False
    has_mask = h.convention != "none"
    kw = dict(keep=keep, lens=torch.tensor([0, T])) if has_mask else {}
    try:
        out = h.call(m16, x, **kw)
        problem = None if torch.isfinite(out).all() else Tx("measured.nan-in-output")
    except Exception as err:
        problem = f"{type(err).__name__}: {first_line(err, 150)}"
    if problem is None:
        return []
    try:
        m32 = h.fresh()
        dropout_knobs(m32, 0.0)
        twin = h.call(m32.eval(), x.float(), **kw)
        if not torch.isfinite(twin).all():
            return []  # not a half-precision problem (nan-or-inf says it)
    except Exception:
        return []
    body: list = []
    call = f"out = run({h.args_text('x')})"
    if has_mask:
        kl, kwt = h.mask_text(["keep = torch.ones(5, 5, dtype=torch.bool)",
                                  note("keep[0] = False", "repro.query0-no-key")],
                                 f"[0, {T}]")
        body, call = kl, f"out = run({h.args_text('x')}, {kwt})"
    return [Finding("float16-overflow", Tx("mha.half", dtype=dtype, problem=problem,
                                           cause=overflow_cause(h.m, dtype, str(problem), m16)),
                    Tx("measured.raised", name=problem),
                    reproducer=h.repro(body + [
                        call, "print(out[0, :2])", "assert torch.isfinite(out).all(), "
                        + said("repro.half-non-finite", dtype=dtype)],
                                          dtype=dtype))]
