"""``attnkit trace``: the shape of every step of one multi-head attention (NumPy only).

Seed 001 printed shapes in a verbose mode; this does the same through the reference
:func:`attnkit.numpy.multi_head_attention` and its ``trace`` callback, and names each shape
in DESIGN.md's vocabulary (``B``, ``H``, ``Hkv``, ``Tq``, ``Tk``, ``Dk``, ``Dv``, ``E``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import numpy as an

__all__ = ["SHAPE_NAMES", "trace_shapes"]

Say = Callable[[str], None]

# Symbolic shape of every step multi_head_attention traces (DESIGN.md's vocabulary).
SHAPE_NAMES = {
    "query": "(B, Tq, E)",
    "W_q": "(H, E, Dk)",
    "W_k": "(Hkv, Ek, Dk)",
    "W_v": "(Hkv, Ev, Dv)",
    "W_o": "(H*Dv, Eo)",
    "q": "(B, H, Tq, Dk)",
    "k": "(B, Hkv, Tk, Dk)",
    "v": "(B, Hkv, Tk, Dv)",
    "scores": "(B, H, Tq, Tk)",
    "weights": "(B, H, Tq, Tk)",
    "head outputs": "(B, H, Tq, Dv)",
    "concat": "(B, Tq, H*Dv)",
    "output": "(B, Tq, Eo)",
}


def trace_shapes(
    *,
    embed_dim: int = 35,
    num_heads: int = 5,
    batch: int = 3,
    seq: int = 11,
    kv_seq: int | None = None,
    head_dim: int | None = None,
    num_kv_heads: int | None = None,
    seed: int = 0,
    say: Say = print,
) -> tuple[np.ndarray, np.ndarray]:
    """Run one multi-head attention and report the shape of every step (seed 001's verbose
    mode), each with its symbolic name.

    Args:
        embed_dim: ``E``.
        num_heads: ``H``.
        batch: ``B``.
        seq: ``Tq`` (and ``Tk`` for self-attention).
        kv_seq: ``Tk`` for cross-attention; None = self-attention.
        head_dim: ``Dk = Dv``; default ``E // H`` (then ``E % H == 0`` is needed).
        num_kv_heads: ``Hkv`` (grouped-query attention); default ``H``.
        seed: seeds the random input and weights.
        say: receives each printed line.

    Returns:
        ``(out (B, Tq, E), weights (B, H, Tq, Tk))``.

    Raises:
        ValueError: for sizes that do not fit together (the message names them).
    """
    for name, val in (("embed_dim", embed_dim), ("num_heads", num_heads), ("batch", batch),
                      ("seq", seq), ("kv_seq", kv_seq), ("head_dim", head_dim),
                      ("num_kv_heads", num_kv_heads)):
        if val is not None and val < 1:
            raise ValueError(f"{name} must be >= 1, got {val}")
    if num_kv_heads is not None and num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}"
        )
    rng = np.random.default_rng(seed)
    params = an.MultiHeadParams.init(
        embed_dim, num_heads, head_dim=head_dim, num_kv_heads=num_kv_heads, rng=rng
    )
    x = rng.normal(size=(batch, seq, embed_dim))
    memory = None if kv_seq is None else rng.normal(size=(batch, kv_seq, embed_dim))
    say(
        f"  multi-head attention: B={batch} Tq={seq} Tk={kv_seq or seq} E={embed_dim} "
        f"H={num_heads} Hkv={params.num_kv_heads} Dk=Dv={params.head_dim}"
        + ("  (self-attention)" if memory is None else "  (cross-attention)")
    )

    def report(step: str, shape: tuple[int, ...]) -> None:
        label = SHAPE_NAMES.get(step, "")
        say(f"    {step:<13}{label:<17}{shape}")

    return an.multi_head_attention(params, x, memory, trace=report)
