"""attnkit.triton: fused attention kernels (forward, backward, decoding) on Triton.

Import is cheap and never fails: the kernels load on first use, so ``is_available()`` can
be asked without Triton installed (reaching a kernel then raises an ImportError that says
``pip install 'attnkit[triton]'``).

- :func:`flash_attention`: autograd-enabled fused attention, ``(B, H, T, D)`` layout,
  causal/window (bottom-right), GQA/MQA, softcap, ALiBi, any length, head dims up to 256.
- :func:`flash_attention_forward` / :func:`flash_attention_backward`: the same without
  autograd (ring attention builds on them).
- :func:`decode_attention`: few queries against a long KV cache, split over keys and
  merged by log-sum-exp; reads the cache in place.

Each is a ``torch.library`` custom op with a fake implementation and autograd
(:mod:`attnkit.triton.ops`): ``torch.compile(fullgraph=True)`` traces through them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

__all__ = [
    "decode_attention",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_forward",
    "is_available",
]

# Every public kernel goes through its torch.library custom op (attnkit.triton.ops), so
# that torch.compile traces it.
_LAZY = {
    "flash_attention": ".ops",
    "flash_attention_forward": ".ops",
    "flash_attention_backward": ".ops",
    "decode_attention": ".ops",
}


def is_available() -> bool:
    """Triton is importable and there is a CUDA device (or ``TRITON_INTERPRET=1``)."""
    if importlib.util.find_spec("triton") is None:
        return False
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return True
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        # The kernels need torch and triton; without them, say which extra to install.
        from .._optional import require

        for needed in ("torch", "triton"):
            require(needed, extra="triton", user=f"attnkit.triton.{name}")
        module = importlib.import_module(_LAZY[name], __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazily loaded names are public too: list them without loading the kernels.
    return sorted(set(globals()) | set(__all__))
