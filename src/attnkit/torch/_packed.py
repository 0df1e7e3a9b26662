"""Packed documents on the CPU: attention that costs the sum of the documents' squares.

With ``segment_ids``, query ``i`` may attend key ``j`` only when their ids are equal. When
every id fills one contiguous run of positions (packed documents, left or right padding),
the allowed pairs are the blocks "query run x key run of the same id", and everything else
is zero. Running attention on each block alone, instead of on ``Tq x Tk`` scores under a
dense mask, does ``sum_d Tq_d * Tk_d`` work instead of ``Tq * Tk``: for 8 equal documents,
an eighth.

Finding the runs reads the ids back to the host: one read per call, and only here, where
the tensors already live on the CPU, so it never stalls a GPU stream. (Under
``torch.compile`` the path is skipped: the read would break the graph; the dense mask
path is traced instead.) Ids that repeat after a gap, or a call with a ``mask``, ``bias``
or ``valid_lens`` as well, take the dense mask path.

Causal and window constraints are kept exactly: the band ``(left, right)`` around the
bottom-right diagonal of the whole ``Tq x Tk`` matrix is, for the block of query rows
``[qs, qe)`` and key columns ``[ks, ke)``, the band ``(left - s, right + s)`` around the
block's own bottom-right diagonal, with ``s = (qe - ke) + (Tk - Tq)``; for self-attention
on shared ids ``s = 0``, so a causal block is a causal attention of its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["Runs", "packed_attention", "packed_runs"]

# One block (q_start, q_end, k_start, k_end) per document; per batch row.
Runs = list[tuple[int, int, int, int]]

# A per-block call costs about as much as this many scores (Python, dispatch, small-tile
# inefficiency, measured on the 2-core box): below it, one dense call wins.
_CALL_COST = 128 * 128


def _runs(ids: list[int]) -> dict[int, tuple[int, int]] | None:
    """``{id: (start, end)}`` of the contiguous runs of the non-negative ids, or None when
    some id comes back after a gap (then the blocks are not contiguous)."""
    runs: dict[int, tuple[int, int]] = {}
    start = 0
    for t in range(1, len(ids) + 1):
        if t == len(ids) or ids[t] != ids[start]:
            x = ids[start]
            if x >= 0:
                if x in runs:
                    return None
                runs[x] = (start, t)
            start = t
    return runs


def packed_runs(q_ids: torch.Tensor, kv_ids: torch.Tensor) -> list[Runs] | None:
    """The blocks of each batch row (query run x key run of the same id), or None when the
    ids are not contiguous runs or the blocks would not save work over one dense call.

    Reads the ids back to the host (CPU tensors: no device sync).
    """
    B, Tq, Tk = q_ids.shape[0], q_ids.shape[-1], kv_ids.shape[-1]
    same = q_ids is kv_ids
    rows: list[Runs] = []
    for q_row, k_row in zip(q_ids.tolist(), (q_ids if same else kv_ids).tolist()):
        q_runs = _runs(q_row)
        k_runs = q_runs if same else _runs(k_row)
        if q_runs is None or k_runs is None:
            return None
        rows.append([qr + k_runs[x] for x, qr in q_runs.items() if x in k_runs])
    if all(blocks == rows[0] for blocks in rows):
        rows = rows[:1]  # one call per block serves every batch row
    per_row = B // len(rows)  # batch rows each call covers
    cost = sum(
        per_row * (qe - qs) * (ke - ks) + _CALL_COST for blocks in rows for qs, qe, ks, ke in blocks
    )
    return rows if cost < B * Tq * Tk else None


def _band_of_block(
    band: tuple[int | None, int | None], block: tuple[int, int, int, int], Tq: int, Tk: int
) -> dict[str, object]:
    """The global band as ``causal``/``window`` arguments for one block (module docstring)."""
    qs, qe, ks, ke = block
    shift = (qe - ke) + (Tk - Tq)
    left = None if band[0] is None else band[0] - shift
    right = None if band[1] is None else band[1] + shift
    if left is None and right == 0:
        return {"causal": True, "window": None}  # lets SDPA use its own causal kernel
    if left is None and right is None:
        return {"causal": False, "window": None}
    return {"causal": False, "window": (left, right)}


def packed_attention(
    attend: Callable[..., tuple[torch.Tensor, torch.Tensor | None]],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rows: list[Runs],
    band: tuple[int | None, int | None],
    scores_shape: tuple[int, ...],
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention block by block: ``attend(q_block, k_block, v_block, causal=, window=)``
    (the caller's attention with every other option bound) on each block of
    :func:`packed_runs`; rows outside every block get output 0 and weights 0.

    Args:
        q, k, v: ``(B, ..., T, D)``, batch on axis 0.
        rows: :func:`packed_runs`' blocks, one list per batch row (or one for all rows).
        band: the call's causal/window band around the bottom-right diagonal.
        scores_shape: ``(B, ..., Tq, Tk)``.
    """
    Tq, Tk = scores_shape[-2], scores_shape[-1]
    out = q.new_zeros(scores_shape[:-1] + (v.shape[-1],))
    weights = q.new_zeros(scores_shape) if need_weights else None
    for b, blocks in enumerate(rows):
        # One list for all rows: whole batch per block; else batch row b (k/v may
        # broadcast a batch of 1).
        rb = slice(None) if len(rows) == 1 else slice(b, b + 1)
        kb = rb if k.shape[0] > 1 else slice(None)
        qb = rb if q.shape[0] > 1 else slice(None)
        for block in blocks:
            qs, qe, ks, ke = block
            o, w = attend(
                q[qb, ..., qs:qe, :], k[kb, ..., ks:ke, :], v[kb, ..., ks:ke, :],
                **_band_of_block(band, block, Tq, Tk),
            )
            out[rb, ..., qs:qe, :] = o
            if weights is not None and w is not None:
                weights[rb, ..., qs:qe, ks:ke] = w
    return out, weights
