"""attnkit: attention building blocks, from a readable NumPy reference to fused kernels.

Subpackages (imported on demand, so ``import attnkit.numpy`` needs NumPy only):

- ``attnkit.numpy``: reference ops, forward and backward, float64 exact.
- ``attnkit.torch``: functional ops and ``nn.Module`` s (extra ``torch``).
- ``attnkit.triton``: fused GPU kernels (extra ``triton``).
- ``attnkit.distributed``: ring attention over ``torch.distributed`` (extra ``torch``).
- ``attnkit.viz``: heatmaps (extra ``viz``).

Used without its extra, a subpackage raises an ImportError that names it, e.g.
``pip install 'attnkit[torch]'``.
"""

from __future__ import annotations

__version__ = "0.1.0"
