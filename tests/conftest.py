"""Shared fixtures. Tests seed their own generators; nothing here depends on a GPU."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)
