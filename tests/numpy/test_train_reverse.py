"""The pure-NumPy model learns to reverse digits (reduced size: a few seconds)."""

from __future__ import annotations

import numpy as np

from attnkit.numpy.train import train_reverse


def test_reverse_training_learns_and_saves_plot_data(tmp_path) -> None:
    result = train_reverse(steps=80, eval_size=300, seed=0, log=None)
    assert result.loss.shape == (80,)
    assert np.all(np.isfinite(result.loss))
    # chance level is log(10) = 2.3; the loss must fall far below it
    assert result.loss[:5].mean() > 2.0
    assert result.loss[-10:].mean() < 0.1 * result.loss[:5].mean()
    assert result.accuracy >= 0.95

    H, T = 2, 8
    assert result.attention.shape == (H, T, T) and result.tokens.shape == (T,)
    assert np.allclose(result.attention.sum(-1), 1.0)
    # reversal is an alignment: output i reads input T-1-i, in at least one head
    flipped = result.attention[:, np.arange(T), T - 1 - np.arange(T)]  # (H, T)
    assert np.all(flipped.max(axis=0) > 0.5)

    path = tmp_path / "run.npz"
    result.save(str(path))
    data = np.load(path)
    assert set(data.files) == {"loss", "accuracy", "attention", "tokens"}
    assert np.array_equal(data["loss"], result.loss)
    assert float(data["accuracy"]) == result.accuracy


def test_reverse_training_is_seeded() -> None:
    a = train_reverse(steps=5, eval_size=20, seed=3, log=None)
    b = train_reverse(steps=5, eval_size=20, seed=3, log=None)
    c = train_reverse(steps=5, eval_size=20, seed=4, log=None)
    assert np.array_equal(a.loss, b.loss)
    assert not np.array_equal(a.loss, c.loss)
