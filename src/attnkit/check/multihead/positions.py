"""The probes of ``check_multi_head`` that ask which positions an output depends on:
causality (do later positions move earlier outputs?), ``causal-leak`` when the module is
declared causal, and ``mixes-queries`` (does one query move another query's output?).
Each takes the :class:`~attnkit.check.multihead.probe.Harness`.
"""

from __future__ import annotations

import torch

from ..catalogue import T as Tx
from ..core.report import Finding
from ..core.repro import note, quoted, said
from .probe import B, E, Harness, T, _rand

__all__ = ["causality", "causal_leak", "mixes_queries"]


def causality(h: Harness) -> bool | None:
    """Does a change at positions 3 and 4 leave the outputs at 0..2 alone (h-attention:
    ``m(x)``, or ``m(x, x, x)``)? None when the module cannot be called so."""
    x = _rand(B, T, E, seed=6)
    y = x.clone()
    y[:, 3:] += 2 * _rand(B, 2, E, seed=7)
    try:
        with torch.no_grad():
            a, b = h.call(h.eval(h.m), x), h.call(h.m, y)
    except Exception:
        return None
    h.behaves_causal = bool(torch.allclose(a[:, :3], b[:, :3], atol=1e-5))
    return h.behaves_causal


def causal_leak(h: Harness) -> Finding:
    """The error finding for a module declared causal whose early outputs see later
    positions."""
    msg = Tx("mha.causal-leak")
    return Finding("causal-leak", msg, Tx("measured.early-moved"),
                   reproducer=h.repro([
        "y = x.clone()", note("y[:, 3:] += 1.0", "repro.change-later"),
        f"a, b = run({h.args_text('x')}), run({h.args_text('y')})",
        "assert torch.allclose(a[:, :3], b[:, :3], atol=1e-5), " + quoted(msg)]))


def _raises_on_lengths(h: Harness, m: torch.nn.Module) -> bool:
    """The module that ran on queries and keys of one length raises on 3 queries and 7
    keys: it mixes the two lengths, which also mixes the queries (not the heads' split)."""
    try:
        with torch.no_grad():
            h.call(m, _rand(B, 3, E), _rand(B, 7, E, seed=1))
    except Exception:
        return True
    return False


def mixes_queries(h: Harness) -> list[Finding]:
    """Does changing query row 4 leave output rows 0..3 alone (``m(query, key, value)``
    only: each query's output depends on its own query and the keys/values)? Heads
    split with ``view(B, H, T, Dk)``, or merged with ``view(B, T, E)`` without
    transposing back, mix tokens: a change at one query moves other queries' rows."""
    if h.self_only:
        return []  # m(x): the query is also a key, and positional encodings mix rows
    x, kv = _rand(B, T, E), _rand(B, T, E, seed=1)
    y = x.clone()
    y[:, T - 1] += 2 * _rand(B, E, seed=9)
    m = h.eval(h.m)
    try:
        with torch.no_grad():
            a, again, b = h.call(m, x, kv), h.call(m, x, kv), h.call(m, y, kv)
    except Exception:
        return []  # the shape probe says what the module raises
    if a.shape != (B, T, E) or b.shape != (B, T, E):
        return []  # a shape finding
    if not torch.allclose(a, again, rtol=1e-6, atol=1e-6):
        return []  # random (dropout on): nondeterministic or dropout-in-eval says so
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return []  # nan-or-inf says what is wrong
    rows = slice(0, T - 1)
    if torch.allclose(a[:, rows], b[:, rows], rtol=1e-5, atol=1e-5):
        return []
    moved = [i for i in range(T - 1)
             if not torch.allclose(a[:, i], b[:, i], rtol=1e-5, atol=1e-5)]
    msg = Tx("mha.mixes-queries-lengths" if _raises_on_lengths(h, m) else
             "mha.mixes-queries", query=T - 1, moved=str(moved))
    return [Finding("mixes-queries", msg,
                    Tx("measured.queries-moved", moved=str(moved),
                      value=float((a - b)[:, rows].abs().max())),
                    reproducer=h.repro([
                        f"kv = torch.randn({B}, {T}, {E}, "
                        f"generator=torch.Generator().manual_seed(1))",
                        "y = x.clone()",
                        note(f"y[:, {T - 1}] += 1.0", "repro.change-last"),
                        "a, b = run(x, kv, kv), run(y, kv, kv)",
                        f"assert torch.allclose(a[:, :{T - 1}], b[:, :{T - 1}], "
                        "atol=1e-5), " + said("repro.mixes-queries")]))]
