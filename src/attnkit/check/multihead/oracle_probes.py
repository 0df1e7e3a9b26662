"""The probes the multi-head oracle runs where a comparison disagrees and no reading
explains it (:mod:`attnkit.check.multihead.oracle`): tokens mixed across the batch, whether
the output is linear in what the projections give as v (dot-product attention's is), scores
that depend on positions, parameters no ``nn.Linear`` holds."""

from __future__ import annotations

from typing import Any

import torch

from .structure import Candidate, Capture

__all__ = ["batch_mixing", "extra_parameters", "linear_in_v", "positional", "tokens_alone"]

B, T = 2, 5


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def batch_mixing(h: Any, m: Any, cap: Capture) -> bool:
    """Does changing example 1 of the batch move example 0's output?"""
    xq, xkv, xv = cap.xq.clone(), cap.xkv.clone(), cap.xv.clone()
    xq[1] += 2 * _rand(T, xq.shape[-1], seed=25)
    if not h.self_only:
        xkv[1] += 2 * _rand(T, xkv.shape[-1], seed=26)
        xv[1] += 2 * _rand(T, xv.shape[-1], seed=28)
    try:
        with torch.no_grad():
            out = h.call(m, xq, None if h.self_only else xkv, xv=xv)
    except Exception:
        return False
    return not torch.allclose(out[0], cap.out[0], rtol=1e-5, atol=1e-5)


def positional(h: Any, m: Any, cap: Capture) -> bool:
    """Do the scores depend on the positions? A module without positional terms is
    equivariant: permuting the query tokens permutes its outputs (and permuting the key and
    value tokens together changes nothing). Rotary or relative position embeddings break
    that."""
    perm = torch.tensor([3, 0, 4, 1, 2])
    xq = cap.xq[:, perm]
    xkv = xq if h.self_only else cap.xkv[:, perm.flip(0)]
    try:
        with torch.no_grad():
            out = h.call(m, xq, None if h.self_only else xkv, xv=cap.xv[:, perm.flip(0)])
    except Exception:
        return False
    return not torch.allclose(out, cap.out[:, perm], rtol=1e-4, atol=1e-5)


def _v_columns(cand: Candidate, width: int) -> torch.Tensor:
    """The columns of the projection that gives v, as a bool ``(width,)`` mask."""
    i, first, n = cand.parts[2]
    cols = torch.zeros(width, dtype=torch.bool)
    if cand.interleave:
        idx = torch.arange(width)
        cols = (idx // cand.d) % 3 == first // cand.d
    else:
        cols[first:first + n] = True
    return cols


def linear_in_v(h: Any, m: Any, cap: Capture, cand: Candidate) -> bool:
    """Is the output linear in what the candidate reads as v, and does v reach it? (The
    attention core is, for fixed q and k.) Adds ``t * u`` to v's columns of the projection
    that gives it, for ``t`` = 1 and 2."""
    c = cap.linears[cand.parts[2][0]]
    cols = _v_columns(cand, int(c.module.out_features))
    u = _rand(*c.out.shape, seed=27) * cols * float(c.out.std())
    outs = []
    for t in (1.0, 2.0):
        handle = c.module.register_forward_hook(lambda mod, a, out, t=t: out + t * u)
        try:
            with torch.no_grad():
                outs.append(h.call(m, cap.xq, None if h.self_only else cap.xkv, xv=cap.xv))
        except Exception:
            return False
        finally:
            handle.remove()
    one, two = outs[0] - cap.out, outs[1] - cap.out
    scale = float(one.abs().max())
    return scale > 1e-4 and bool(torch.allclose(two, 2 * one, rtol=1e-3, atol=1e-4 * scale))


def extra_parameters(m: Any) -> list[str]:
    """The module's parameters that no ``nn.Linear`` holds (learned keys, temperatures,
    biases of its own): what the oracle does not read."""
    held = {id(p) for mod in m.modules() if isinstance(mod, torch.nn.Linear)
            for p in mod.parameters()}
    return [name for name, p in m.named_parameters() if id(p) not in held]


def tokens_alone(h: Any, m: Any, cap: Capture) -> bool:
    """Does no token's output read another token (self-attention ``m(x)``)? Changing token 0
    moves no later output: attention that runs over the heads (q, k, v split without
    ``transpose(1, 2)``, scores ``(B, T, H, H)``), not over the tokens. A causal module's
    query 1 must see key 0."""
    if not h.self_only:
        return False
    xq = cap.xq.clone()
    xq[:, 0] += 2 * _rand(B, xq.shape[-1], seed=30)
    try:
        with torch.no_grad():
            out = h.call(m, xq, None)
    except Exception:
        return False
    return bool(torch.allclose(out[:, 1:], cap.out[:, 1:], rtol=1e-5, atol=1e-5))
