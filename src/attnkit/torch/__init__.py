"""attnkit.torch: functional attention and ``nn.Module`` s for PyTorch.

Semantics are those of :mod:`attnkit.numpy` (the float64 oracle): masks say True = may
attend, ``causal``/``window`` are bottom-right aligned, ``valid_lens`` follows d2l, GQA is
read off axis -3, and a query with no allowed key gets output 0 and zero gradients.

:class:`MultiheadAttention` (torch's spelling) is the one class that speaks torch's
conventions: a drop-in ``torch.nn.MultiheadAttention`` (its arguments, masks in its
polarity, its state dicts) that runs on the above; :func:`swap_attention` puts it into an
existing model.

:mod:`attnkit.torch.d2l` holds d2l's attention classes as drop-ins
(``from attnkit.torch import d2l``; ``d2l.MultiHeadAttention(num_hiddens, num_heads,
dropout)``), next to the two that are also exported here under d2l's names.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401  (the extra this subpackage needs)
except ModuleNotFoundError as _err:
    from .._optional import raise_missing

    raise_missing(_err, "torch", extra="torch", user="attnkit.torch")

from . import d2l
from .additive import additive_attention, additive_scores
from .cache import KVCache
from .d2l import PositionalEncoding
from .functional import attention
from .interop import to_torch
from .lse import attention_with_lse, attention_with_lse_backward
from .masks import (
    attention_mask,
    causal_mask,
    from_attn_mask,
    from_key_padding_mask,
    masked_softmax,
    segment_ids_from_cu_seqlens,
    segment_ids_from_lengths,
    segment_ids_from_padding_mask,
    segment_mask,
    sequence_mask,
    window_mask,
)
from .mha import MultiHeadAttention, from_torch
from .modules import AdditiveAttention, DotProductAttention
from .nn_compat import MultiheadAttention, swap_attention
from .softmax import safe_softmax

__all__ = [
    "AdditiveAttention",
    "DotProductAttention",
    "KVCache",
    "MultiHeadAttention",
    "MultiheadAttention",
    "PositionalEncoding",
    "additive_attention",
    "additive_scores",
    "attention",
    "attention_mask",
    "attention_with_lse",
    "attention_with_lse_backward",
    "causal_mask",
    "d2l",
    "from_attn_mask",
    "from_key_padding_mask",
    "from_torch",
    "masked_softmax",
    "safe_softmax",
    "segment_ids_from_cu_seqlens",
    "segment_ids_from_lengths",
    "segment_ids_from_padding_mask",
    "segment_mask",
    "sequence_mask",
    "swap_attention",
    "to_torch",
    "window_mask",
]
