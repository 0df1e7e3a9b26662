"""Every check test starts with reports in English: ``print(report)`` follows
``set_language`` and ``ATTNKIT_LANG``, which a test (or the caller's shell) may have set."""

from __future__ import annotations

import pytest

from attnkit.check.catalogue.messages import set_language


@pytest.fixture(autouse=True)
def english_by_default(monkeypatch):
    monkeypatch.delenv("ATTNKIT_LANG", raising=False)
    set_language(None)
    yield
    set_language(None)
