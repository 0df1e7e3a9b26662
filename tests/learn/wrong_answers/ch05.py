"""Typical wrong answers to the exercises of chapter 5, each with the finding that names it."""

from __future__ import annotations

import math

import torch


class _SoftmaxForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.softmax(x.float(), dim=-1).to(x.dtype)
        ctx.save_for_backward(y)
        return y


class SoftmaxNoRowTerm(_SoftmaxForward):
    """``y * dy``: the diagonal of the Jacobian only."""

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return y * dy


class SoftmaxRowSumOfDy(_SoftmaxForward):
    """The row term as ``sum(dy)`` instead of ``sum(dy * y)``."""

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return y * (dy - dy.sum(dim=-1, keepdim=True))


class SoftmaxDiagonalFormula(_SoftmaxForward):
    """``dy * y * (1 - y)``: the derivative of each output by its own input only."""

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return dy * y * (1 - y)


class SoftmaxNaiveForward(torch.autograd.Function):
    """A right backward behind a forward without the max trick."""

    @staticmethod
    def forward(ctx, x):
        e = torch.exp(x)
        y = e / e.sum(dim=-1, keepdim=True)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return y * (dy - (dy * y).sum(dim=-1, keepdim=True))


class _AttentionForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        p = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        ctx.save_for_backward(q, k, v, p)
        return p @ v


def _ds(p, d_out, v):
    dp = d_out @ v.transpose(-2, -1)
    return p * (dp - (dp * p).sum(dim=-1, keepdim=True))


class AttentionDqUnscaled(_AttentionForward):
    """``dq = ds @ k``: the scale forgotten on one side."""

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, p = ctx.saved_tensors
        s, ds = 1 / math.sqrt(q.shape[-1]), _ds(p, d_out, v)
        return ds @ k, ds.transpose(-2, -1) @ q * s, p.transpose(-2, -1) @ d_out


class AttentionDkNotTransposed(_AttentionForward):
    """``dk = ds @ q``: runs while Tq == Tk, wrong even then."""

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, p = ctx.saved_tensors
        s, ds = 1 / math.sqrt(q.shape[-1]), _ds(p, d_out, v)
        return ds @ k * s, ds @ q * s, p.transpose(-2, -1) @ d_out


class AttentionDvNotTransposed(_AttentionForward):
    """``dv = p @ d_out``: p's transpose forgotten."""

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, p = ctx.saved_tensors
        s, ds = 1 / math.sqrt(q.shape[-1]), _ds(p, d_out, v)
        return ds @ k * s, ds.transpose(-2, -1) @ q * s, p @ d_out


class AttentionNoRowTerm(_AttentionForward):
    """``ds = p * dp``: the softmax's row term left out."""

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, p = ctx.saved_tensors
        s = 1 / math.sqrt(q.shape[-1])
        ds = p * (d_out @ v.transpose(-2, -1))
        return ds @ k * s, ds.transpose(-2, -1) @ q * s, p.transpose(-2, -1) @ d_out


WRONG = [
    ("Softmax", SoftmaxNoRowTerm, "gradient"),
    ("Softmax", SoftmaxRowSumOfDy, "gradient"),
    ("Softmax", SoftmaxDiagonalFormula, "gradient"),
    ("Softmax", SoftmaxNaiveForward, "nan-or-inf"),
    ("Attention", AttentionDqUnscaled, "gradient"),
    ("Attention", AttentionDkNotTransposed, "gradient"),
    ("Attention", AttentionDvNotTransposed, "gradient"),
    ("Attention", AttentionNoRowTerm, "gradient"),
]

# What the report must say about each (a pattern of its finding's message, in English, and
# found again in the Chinese report, where words that are not code have their Chinese
# after a |): the line to change.
DIAGNOSIS = {
    "SoftmaxNoRowTerm": r"respect to x|关于 x 的梯度",
    "SoftmaxRowSumOfDy": r"respect to x|关于 x 的梯度",
    "SoftmaxDiagonalFormula": r"respect to x|关于 x 的梯度",
    "SoftmaxNaiveForward": r"max",
    "AttentionDqUnscaled": r"respect to q\b|关于 q 的梯度",
    "AttentionDkNotTransposed": r"respect to k\b|关于 k 的梯度",
    "AttentionDvNotTransposed": r"respect to v\b|关于 v 的梯度",
    "AttentionNoRowTerm": r"respect to q\b|关于 q 的梯度",
}
