"""Shared fixtures. Tests seed their own generators; nothing here depends on a GPU."""

from __future__ import annotations

import pytest

import numpy as np


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)
