"""The reproducers of ``check_model``: their form follows what the finding found (not the
words of its sentence)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers",
                    reason="check model needs `pip install attnkit[transformers]`")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_faults import register_faults  # noqa: E402

from attnkit.check import check_model  # noqa: E402
from attnkit.check.catalogue import words  # noqa: E402
from attnkit.check.model.load import tiny_model  # noqa: E402

register_faults()


def _window_finding():
    report = check_model(tiny_model("mistral", "float32"),
                         implementations=["sdpa", "fault-no-window"], padding="none")
    (f,) = report.findings("fault-no-window")
    assert f.code == "mask-mismatch" and f.key is None, report.table()
    return f


def test_the_reproducer_form_follows_the_finding_not_its_words(monkeypatch):
    """An ignored sliding window: the mask the call received was right, so the reproducer
    reruns the function against the oracle, with the window's sentence reworded too (the
    form was once chosen by the word "ignores" in the English message)."""
    monkeypatch.setitem(words("en"), "model.window",
                        "the attention function attends keys {window} or more positions "
                        "back, outside this layer's sliding window")
    f = _window_finding()
    assert "ignores" not in f.message
    assert "reference_attention" in f.reproducer and "d['expected']" not in f.reproducer
    with pytest.raises(AssertionError, match="mask-mismatch"):
        exec(f.reproducer, {})
