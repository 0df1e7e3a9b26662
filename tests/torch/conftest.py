"""Shared setup for the attnkit.torch tests. The float64 NumPy reference is the oracle;
small conversion helpers live in each test module (pytest's importlib mode keeps this file
from being importable)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """These tests use small tensors, where intra-op threads cost more than they save
    (and oversubscribe a shared 2-core machine). Restored afterwards for other folders."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
