"""Solutions to the exercises of chapter 5, "Gradients by hand"."""

from __future__ import annotations

import math

import torch


class Softmax(torch.autograd.Function):
    """Softmax over the last axis with a hand-written backward (the vector-Jacobian
    product ``dx = y * (dy - sum(dy * y))``; the Jacobian itself is never built)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = torch.softmax(x.float(), dim=-1).to(x.dtype)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        row = (dy * y).sum(dim=-1, keepdim=True)       # (..., 1): one number per row
        return y * (dy - row)


class Attention(torch.autograd.Function):
    """``softmax(q k^T / sqrt(Dk)) v`` with a hand-written backward.

    Shapes: ``q (..., Tq, Dk)``, ``k (..., Tk, Dk)``, ``v (..., Tk, Dv)`` -> ``(..., Tq, Dv)``.
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        ctx.save_for_backward(q, k, v, p)
        return p @ v

    @staticmethod
    def backward(ctx, d_out: torch.Tensor):
        q, k, v, p = ctx.saved_tensors
        scale = 1 / math.sqrt(q.shape[-1])
        dv = p.transpose(-2, -1) @ d_out                   # (..., Tk, Dv)
        dp = d_out @ v.transpose(-2, -1)                   # (..., Tq, Tk)
        ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))  # the softmax VJP, row by row
        dq = ds @ k * scale                                # (..., Tq, Dk)
        dk = ds.transpose(-2, -1) @ q * scale              # (..., Tk, Dk)
        return dq, dk, dv
