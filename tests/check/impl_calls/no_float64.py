"""A correct module that refuses float64 inputs, as wrappers of fused kernels do (they
take float32, float16 and bfloat16 only). The check's float64 finite differences of its
gradients could not run it, and that was reported as the user's ``call-failed``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SUPPORTED = (torch.float32, torch.float16, torch.bfloat16)


class KernelDtypesOnly(nn.Module):
    """Fused qkv, SDPA; raises on a dtype its kernel would not take."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.h = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in SUPPORTED:
            raise TypeError(f"the kernel takes float32, float16 or bfloat16, not {x.dtype}")
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, E // self.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(B, T, E))


class NumpyInForward(nn.Module):
    """Reads its head size off a NumPy view of the input: the forward is right, but an
    input that requires a gradient cannot be viewed so (the gradients probe raises)."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.h = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.numpy().shape[-1] // self.h  # raises when x requires grad
        B, T, E = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, d).permute(2, 0, 3, 1, 4)
        w = torch.softmax(q @ k.transpose(-1, -2) / d ** 0.5, dim=-1)
        return self.proj((w @ v).transpose(1, 2).reshape(B, T, E))
