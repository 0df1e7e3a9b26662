"""Before ring attention moves any K/V, every rank checks that all ranks hold the same kind
of shards: one all-gather of a small int64 vector per rank.

Why: a rank whose shards differ from its peer's sends a buffer of another size or layout
than the peer expects. On gloo a size mismatch aborts the receiving process (SIGABRT inside
gloo, no Python error), and shards with the same byte count ((1, 2, 8, 8) against
(1, 2, 4, 16)) run to completion on misread data. With the exchange, every rank raises the
same ``ValueError`` naming every rank's shards, in the time of one small collective.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..spec import shape_of

__all__ = ["agree"]

_LAYOUTS = ("zigzag", "contiguous")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_MAX_DIMS = 6  # shapes of more dims are cut (they fail the (B, H, T, D) check anyway)


def _code(x: object, known: tuple) -> int:
    """Index of ``x`` in ``known`` (``len(known)`` if absent); never raises."""
    for i, kn in enumerate(known):
        if x is kn or (type(x) is type(kn) and x == kn):
            return i
    return len(known)


def _numel(x: object) -> int:
    """Elements of a tensor or array (-1 for anything else); never raises."""
    n = getattr(x, "numel", None) or getattr(x, "size", None)
    try:
        return int(n() if callable(n) else n)
    except (TypeError, ValueError):
        return -1


_CAUSAL = (False, True, "bottom_right", "top_left")


def _describe(row: list[int]) -> str:
    names = []
    for i, name in enumerate("qkv"):
        n = row[i]
        dims = row[3 + i * _MAX_DIMS : 3 + i * _MAX_DIMS + min(n, _MAX_DIMS)]
        dtype = row[3 + 3 * _MAX_DIMS + i]
        dt = str(_DTYPES[dtype]).removeprefix("torch.") if dtype < len(_DTYPES) else "other"
        names.append(f"{name} {tuple(dims)} {dt}")
    layout, causal, has_vl, lo, hi, softcap, sinks, seg_q, seg_kv = row[-9:]
    lay = _LAYOUTS[layout] if layout < len(_LAYOUTS) else "?"
    text = ", ".join(names) + f", layout {lay}, causal {_CAUSAL[causal] if causal < 4 else '?'}"
    text += f", valid_lens in [{lo}, {hi}]" if has_vl else ""
    text += ", softcap" if softcap else ""
    text += ", sinks" if sinks else ""
    text += f", segment_ids of {seg_q} and {seg_kv} ids" if seg_q else ""
    return text


def agree(
    group: dist.ProcessGroup | None, size: int, q: torch.Tensor, k: torch.Tensor,
    v: torch.Tensor, layout: str, causal: object, valid_lens: torch.Tensor | None,
    softcap: object, sinks: object, segment_ids: object,
) -> None:
    """One all-gather of a small int64 vector per rank before any K/V transfer: raise the
    same ``ValueError`` on every rank, naming every rank's shards, unless all agree.

    Shapes, dtypes, layout, causal, the valid_lens range and which variants are given
    (with the segment ids' sizes) must agree. Nothing here raises before the exchange
    (values are encoded, not checked), and it runs before any local check, so that no
    rank is left waiting for a peer that raised.
    """
    if size == 1:
        return
    row = [min(x.ndim, 99) for x in (q, k, v)]
    for x in (q, k, v):
        dims = list(shape_of(x))[:_MAX_DIMS]
        row += dims + [-1] * (_MAX_DIMS - len(dims))
    row += [_code(x.dtype, _DTYPES) for x in (q, k, v)]
    lo = hi = 0
    has_vl = valid_lens is not None
    if isinstance(valid_lens, torch.Tensor) and valid_lens.numel():
        if not (valid_lens.is_floating_point() or valid_lens.is_complex()):
            lo, hi = torch.stack(torch.aminmax(valid_lens)).tolist()
    pair = segment_ids if isinstance(segment_ids, (tuple, list)) else (segment_ids,) * 2
    seg = [0, 0] if segment_ids is None else [_numel(x) for x in pair[:2]]
    row += [_code(layout, _LAYOUTS), _code(causal, _CAUSAL), int(has_vl), lo, hi,
            int(softcap is not None), int(sinks is not None), *seg]
    on_gpu = dist.get_backend(group) == "nccl"
    mine = torch.tensor(row, dtype=torch.int64, device=q.device if on_gpu else "cpu")
    rows = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(rows, mine, group=group)
    table = [r.tolist() for r in rows]
    if any(r != table[0] for r in table):
        ranks = "; ".join(f"rank {i}: {_describe(r)}" for i, r in enumerate(table))
        raise ValueError(
            "ring_attention: every rank must pass shards of the same shapes and dtypes, "
            f"with the same layout, causal, valid_lens and variants; got {ranks}"
        )
