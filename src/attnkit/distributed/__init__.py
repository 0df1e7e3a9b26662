"""attnkit.distributed: ring attention over a ``torch.distributed`` process group.

Shard a long sequence across processes (gloo on CPU, NCCL on GPU, launched with
``torchrun``), and compute exact attention over all of it::

    q, k, v = (shard_sequence(t) for t in (q_full, k_full, v_full))  # (B, H, T/P, D)
    out = ring_attention(q, k, v, causal=True)                        # (B, H, T/P, D)
    out_full = gather_sequence(out)                                   # (B, H, T, D)

Without an initialised process group everything runs as one rank. See
``docs/distributed.md``.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401  (the extra this subpackage needs)
except ModuleNotFoundError as _err:
    from .._optional import raise_missing

    raise_missing(_err, "torch", extra="torch", user="attnkit.distributed")

from ..torch.lse import attention_with_lse as block_forward
from ..torch.lse import attention_with_lse_backward as block_backward
from .merge import merge_partials
from .ring import ring_attention, ring_attention_backward, ring_attention_forward
from .schedule import Block, chunk_ids, flops_per_rank, num_chunks, step_blocks
from .sharding import gather_sequence, shard_sequence

__all__ = [
    "Block",
    "block_backward",
    "block_forward",
    "chunk_ids",
    "flops_per_rank",
    "gather_sequence",
    "merge_partials",
    "num_chunks",
    "ring_attention",
    "ring_attention_backward",
    "ring_attention_forward",
    "shard_sequence",
    "step_blocks",
]
