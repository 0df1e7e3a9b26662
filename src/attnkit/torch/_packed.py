"""Packed documents on the CPU: attention that costs the sum of the documents' squares.

With ``segment_ids``, query ``i`` may attend key ``j`` only when their ids are equal. When
every id fills one contiguous run of positions (packed documents, left or right padding),
the allowed pairs are the blocks "query run x key run of the same id", and everything else
is zero. Running attention on each block alone, instead of on ``Tq x Tk`` scores under a
dense mask, does ``sum_d Tq_d * Tk_d`` work instead of ``Tq * Tk``: for 8 equal documents,
an eighth.

Finding the runs reads the ids back to the host in each call (nothing is kept on a
caller's tensor; a :class:`PackedIds` pair that attnkit made itself keeps its own), and
only here, where the tensors already live on the CPU, so it never stalls a GPU stream. It
is never tried for a decoding step (one query), nor under ``torch.compile`` (the read
would break the graph; the dense mask path is traced
instead). Ids that repeat after a gap, or a call with a ``mask``, ``bias`` or
``valid_lens`` as well, take the dense mask path.

Causal and window constraints are kept exactly: the band ``(left, right)`` around the
bottom-right diagonal of the whole ``Tq x Tk`` matrix is, for the block of query rows
``[qs, qe)`` and key columns ``[ks, ke)``, the band ``(left - s, right + s)`` around the
block's own bottom-right diagonal, with ``s = (qe - ke) + (Tk - Tq)``; for self-attention
on shared ids ``s = 0``, so a causal block is a causal attention of its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["PackedIds", "Runs", "packed_attention", "packed_runs"]

# One block (q_start, q_end, k_start, k_end) per document; per batch row.
Runs = list[tuple[int, int, int, int]]

# A per-block call costs about as much as this many scores (Python, dispatch, small-tile
# inefficiency, measured on the 2-core box): below it, one dense call wins.
_CALL_COST = 128 * 128


def _row_runs(ids: torch.Tensor) -> list[dict[int, tuple[int, int]] | None]:
    """Per batch row, ``{id: (start, end)}`` of the contiguous runs of its non-negative
    ids, or None for a row where some id comes back after a gap. Tensor ops find where
    the id changes; Python then visits one entry per run, not per position."""
    B, T = ids.shape
    starts = torch.ones(B, T, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    b, t = starts.nonzero(as_tuple=True)
    rows: list[dict[int, tuple[int, int]] | None] = [{} for _ in range(B)]
    found = list(zip(b.tolist(), t.tolist(), ids[b, t].tolist()))
    for n, (row, start, x) in enumerate(found):
        runs = rows[row]
        end = found[n + 1][1] if n + 1 < len(found) and found[n + 1][0] == row else T
        if runs is None or x < 0:
            continue
        if x in runs:
            rows[row] = None
        else:
            runs[x] = (start, end)
    return rows


def packed_runs(q_ids: torch.Tensor, kv_ids: torch.Tensor) -> list[Runs] | None:
    """The blocks of each batch row (query run x key run of the same id), or None when the
    ids are not contiguous runs or the blocks would not save work over one dense call.

    Reads the ids back (CPU tensors only: no device sync). Nothing is kept on the caller's
    tensors: an answer cached there went stale when the ids were written through ``.data``
    or a shared NumPy array, and inference tensors have no version counter to check."""
    return _blocks(q_ids, kv_ids)


class PackedIds(tuple):
    """A ``(q_ids, kv_ids)`` pair of segment ids that attnkit itself made (never a
    caller's tensors) and that keeps its packed runs once found: what transformers' mask
    function hands every layer of one forward, so that the runs are read once per mask,
    not once per layer. The ids must not be written after the first call."""

    _runs: list[Runs] | None
    _found: bool

    def __new__(cls, q_ids: torch.Tensor, kv_ids: torch.Tensor) -> PackedIds:
        pair = super().__new__(cls, (q_ids, kv_ids))
        pair._found = False
        return pair

    def runs(self) -> list[Runs] | None:
        """:func:`packed_runs` of the pair, read on the first call only."""
        if not self._found:
            self._runs, self._found = packed_runs(*self), True
        return self._runs


def _blocks(q_ids: torch.Tensor, kv_ids: torch.Tensor) -> list[Runs] | None:
    B, Tq, Tk = q_ids.shape[0], q_ids.shape[-1], kv_ids.shape[-1]
    q_rows = _row_runs(q_ids)
    k_rows = q_rows if q_ids is kv_ids else _row_runs(kv_ids)
    rows: list[Runs] = []
    for q_runs, k_runs in zip(q_rows, k_rows):
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
