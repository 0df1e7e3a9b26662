"""attnkit: attention building blocks, from a readable NumPy reference to fused kernels.

Subpackages (imported on demand, so ``import attnkit.numpy`` needs NumPy only):

- ``attnkit.numpy``: reference ops, forward and backward, float64 exact.
- ``attnkit.torch``: functional ops and ``nn.Module`` s.
- ``attnkit.triton``: fused GPU kernels.
- ``attnkit.distributed``: ring attention over ``torch.distributed``.
- ``attnkit.viz``: heatmaps.
"""

from __future__ import annotations

__version__ = "0.1.0"
