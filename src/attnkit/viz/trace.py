"""``attnkit trace``: the shape of every step of one multi-head attention (NumPy only).

Teaching code often prints shapes from inside its attention (a verbose flag). Here the
reference :func:`attnkit.numpy.multi_head_attention` only computes: :func:`trace_mha` watches from
outside, running the same named steps of :mod:`attnkit.numpy.mha` that its forward runs and
reporting the shape between each pair. :func:`trace_shapes` (``attnkit trace``) names each
shape in attnkit's shape vocabulary (``B``, ``H``, ``Hkv``, ``Tq``, ``Tk``, ``Dk``, ``Dv``, ``E``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..numpy import mha
from ..numpy.attention import attend
from ..numpy.mha_params import MultiHeadParams

__all__ = ["SHAPE_NAMES", "trace_mha", "trace_shapes"]

Say = Callable[[str], None]
Report = Callable[[str, tuple[int, ...]], None]

# Symbolic shape of every step trace_mha reports, in order (attnkit.spec's shape legend).
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


def _print_shape(step: str, shape: tuple[int, ...]) -> None:
    print(f"{step}.shape={shape}")  # the classic verbose-mode lines


def trace_mha(
    params: MultiHeadParams,
    query: np.ndarray,
    key: np.ndarray | None = None,
    value: np.ndarray | None = None,
    *,
    scale: float | None = None,
    report: Report = _print_shape,
    **options: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`attnkit.numpy.multi_head_attention`, run step by step with the shape of every
    step (the keys of :data:`SHAPE_NAMES`, in order) passed to ``report(step, shape)``.

    Args:
        params, query, key, value, scale: as in :func:`~attnkit.numpy.multi_head_attention`.
        report: receives each ``(step, shape)``; the default prints ``q.shape=(...)`` lines.
        **options: the mask and dropout options of ``multi_head_attention`` (``mask``,
            ``bias``, ``valid_lens``, ``causal``, ``window``, ``dropout_p``, ``rng``).

    Returns:
        ``(out (B, Tq, Eo), weights (B, H, Tq, Tk))`` in the compute dtype: the numbers
        ``multi_head_attention`` returns for the same arguments.
    """
    p, query, key, value = mha.fit_inputs(params, query, key, value)
    report("query", query.shape)
    for name in ("W_q", "W_k", "W_v", "W_o"):
        report(name, getattr(p, name.lower()).shape)
    q, k, v = mha.project_heads(p, query, key, value)
    report("q", q.shape)
    report("k", k.shape)
    report("v", v.shape)
    scores, _, groups = mha.head_scores(q, k, v, scale)
    report("scores", scores.shape)
    out, att = attend(scores, v, groups=groups, **options)
    report("weights", att.weights.shape)
    report("head outputs", out.shape)
    heads = mha.merge_heads(out)
    report("concat", heads.shape)
    y = mha.project_output(p, heads)
    report("output", y.shape)
    return y, att.weights


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
    """Run one multi-head attention and report the shape of every step (a verbose mode
    from outside), each with its symbolic name.

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
            raise ValueError(f"{name}={val} must be >= 1")
    rng = np.random.default_rng(seed)
    params = MultiHeadParams.init(
        embed_dim, num_heads, head_dim=head_dim, num_kv_heads=num_kv_heads, rng=rng
    )
    x = rng.normal(size=(batch, seq, embed_dim))
    memory = None if kv_seq is None else rng.normal(size=(batch, kv_seq, embed_dim))
    say(
        f"  multi-head attention: B={batch} Tq={seq} Tk={kv_seq or seq} E={embed_dim} "
        f"H={num_heads} Hkv={params.num_kv_heads} Dk=Dv={params.head_dim}"
        + ("  (self-attention)" if memory is None else "  (cross-attention)")
    )

    H, Hkv = params.num_heads, params.num_kv_heads

    def report(step: str, shape: tuple[int, ...]) -> None:
        if step == "scores" and Hkv < H:
            say(f"    {_sharing(H, Hkv)}")
        label = SHAPE_NAMES.get(step, "")
        say(f"    {step:<13}{label:<17}{shape}")

    result = trace_mha(params, x, memory, report=report)
    source = "the query input itself" if memory is None else "the memory"
    say(f"    Ek, Ev: widths of the key and value inputs ({source}, {embed_dim} here); "
        f"Eo: width of the output ({embed_dim} here)")
    return result


def _sharing(H: int, Hkv: int) -> str:
    """Which query heads read which key/value head: ``G = H // Hkv`` consecutive ones each."""
    G = H // Hkv
    if Hkv == 1:
        return f"(MQA: all {H} query heads read the one key/value head; k and v are not copied)"
    groups = [f"{g * G}-{g * G + G - 1} read kv head {g}" for g in range(Hkv)]
    shown = ", ".join(groups if Hkv <= 4 else groups[:2] + ["..."] + groups[-1:])
    return (f"(GQA: G = H/Hkv = {G} query heads share each key/value head: query heads "
            f"{shown}; k and v are not copied)")
