"""`attnkit train`: the model learns to align, seeded and reproducible, at small settings."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="attnkit train needs torch")

from attnkit import cli, seq2seq, train_config  # noqa: E402

ACCURACY_LINE = re.compile(r"^exact-match accuracy: (\d\.\d{3})$")


def test_seq2seq_reexports_the_torch_free_config():
    """TrainConfig lives in attnkit.train_config (no torch) so the command reads its defaults
    without torch; seq2seq exposes the same objects (tests/cli/test_cli.py checks the
    command's defaults against it)."""
    assert seq2seq.TrainConfig is train_config.TrainConfig
    assert seq2seq.TASKS == train_config.TASKS and seq2seq.MODELS == train_config.MODELS


@pytest.mark.parametrize("task, expected", [
    ("reverse", [[5, 0, 3, 1], [2, 2, 9, 7]]),
    ("copy", [[1, 3, 0, 5], [7, 9, 2, 2]]),
    ("sort", [[0, 1, 3, 5], [2, 2, 7, 9]]),
])
def test_task_targets(task, expected):
    src = np.array([[1, 3, 0, 5], [7, 9, 2, 2]])
    np.testing.assert_array_equal(seq2seq.targets_for(task, src), expected)


def test_reversal_learns_to_align(tmp_path, capsys, check_png, monkeypatch):
    """A short run through the command: accuracy above a floor, the anti-diagonal learned."""
    runs = []

    def keep_result(*args, **kwargs):
        runs.append(real_train(*args, **kwargs))
        return runs[-1]

    real_train = seq2seq.train
    monkeypatch.setattr(seq2seq, "train", keep_result)
    rc = cli.main(["train", "--task", "reverse", "--steps", "150", "--hidden", "32",
                   "--lr", "1e-2", "--eval-size", "200", "--out", str(tmp_path)])
    assert rc == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    match = ACCURACY_LINE.match(lines[-1])
    assert match, lines[-1]
    # Measured 0.999 on this setting (untrained: 0.000); the floor leaves room for other CPUs.
    assert float(match.group(1)) >= 0.8, lines[-1]
    # The progress bar is tqdm's, on stderr (stdout keeps the results): its last state
    # counts every step and shows the last step's loss.
    assert not any("150/150" in line for line in lines), lines
    last = captured.err.replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("train: 100%") and "150/150" in last, captured.err[-300:]
    png = tmp_path / "train_reverse_additive.png"
    assert f"wrote {png}" in lines
    check_png(png)
    page = tmp_path / "explore_reverse_additive.html"
    assert page.is_file() and "decoder cross-attention (trained)" in page.read_text()

    (result,) = runs
    assert f"loss={result.losses[-1]:.4f}" in last, last
    assert f"{result.accuracy:.3f}" == match.group(1)
    mean = result.eval_weights.mean(0).numpy()  # (T, T): output step x input position
    T = result.config.length
    assert mean.shape == (T, T)
    np.testing.assert_allclose(mean.sum(-1), 1.0, atol=1e-5)
    # Output step t reads input T-1-t: the anti-diagonal is every row's largest weight and
    # carries well over the uniform share 1/T.
    anti = T - 1 - np.arange(T)
    np.testing.assert_array_equal(mean.argmax(-1), anti)
    assert mean[np.arange(T), anti].min() > 2.0 / T


def test_mha_model_learns_reversal_and_plots_heads(tmp_path, capsys, check_png):
    rc = cli.main(["train", "--model", "mha", "--hidden", "32", "--num-heads", "4",
                   "--steps", "100", "--lr", "1e-2", "--eval-size", "200",
                   "--out", str(tmp_path)])
    assert rc == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    match = ACCURACY_LINE.match(last)
    # Measured 0.977 on this setting (untrained: 0.000).
    assert match and float(match.group(1)) >= 0.8, last
    check_png(tmp_path / "train_reverse_mha.png")
    assert (tmp_path / "explore_reverse_mha.html").is_file()  # one page, every head


def test_training_is_reproducible():
    cfg = seq2seq.TrainConfig(steps=15, hidden=16, batch_size=16, eval_size=20, seed=3)
    a, b = seq2seq.train(cfg), seq2seq.train(cfg)
    assert a.losses == b.losses
    assert torch.equal(a.eval_pred, b.eval_pred)
    c = seq2seq.train(dataclasses.replace(cfg, seed=4))
    assert c.losses != a.losses


def test_held_out_sequences_never_train(monkeypatch):
    """Short sequences make collisions certain; the training batches must skip them."""
    cfg = seq2seq.TrainConfig(length=3, eval_size=400, steps=30, hidden=8, batch_size=32)
    held_out = {tuple(r) for r in seq2seq._held_out(cfg).tolist()}
    seen_in_training = []
    real_forward = seq2seq.Seq2Seq.forward

    def spy(self, src, tgt):
        seen_in_training.extend(tuple(r) for r in src.tolist())
        return real_forward(self, src, tgt)

    monkeypatch.setattr(seq2seq.Seq2Seq, "forward", spy)
    seq2seq.train(cfg)
    assert len(held_out) > 300 and len(seen_in_training) > 500
    assert not held_out & set(seen_in_training)


def test_train_restores_torch_threads():
    before = torch.get_num_threads()
    seq2seq.train(seq2seq.TrainConfig(steps=2, hidden=8, batch_size=4, eval_size=4,
                                      threads=before + 1))
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("bad", [{"task": "shuffle"}, {"steps": 0}, {"model": "rnn"},
                                 {"lr": float("nan")}, {"model": "mha", "hidden": 6},
                                 {"length": 3, "eval_size": 1000}])
def test_train_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        seq2seq.TrainConfig(**bad)


def test_cross_attention_figure_labels_means_by_position():
    """The mean panel averages many sequences, so its ticks are positions; the example
    panel carries that example's digits on its own top/right axes."""
    cfg = seq2seq.TrainConfig(steps=5, hidden=16, batch_size=16, eval_size=20, seed=3)
    result = seq2seq.train(cfg)
    fig = seq2seq.plot_cross_attention(result, example=1)
    example, mean = fig.axes[0], fig.axes[1]
    assert mean.get_title().startswith("mean of 20")
    T = cfg.length
    positions = [str(i) for i in range(T)]
    assert [t.get_text() for t in mean.get_xticklabels()] == positions
    # The rows are shared and labelled once, on the left of the row: positions too.
    assert [t.get_text() for t in example.get_yticklabels()] == positions
    top, right = example.child_axes  # the secondary axes, in the order they were added
    assert [t.get_text() for t in top.get_xticklabels()] == [
        str(d) for d in result.eval_src[1].tolist()
    ]
    assert [t.get_text() for t in right.get_yticklabels()] == [
        str(d) for d in result.eval_pred[1].tolist()
    ]


def test_mha_figure_says_which_panels_average_the_heads():
    cfg = seq2seq.TrainConfig(model="mha", num_heads=2, steps=3, hidden=16, batch_size=8,
                              eval_size=6, seed=3)
    fig = seq2seq.plot_cross_attention(seq2seq.train(cfg))
    titles = [ax.get_title() for ax in fig.axes if ax.images]
    assert titles[:2] == ["held-out example 0 (mean of 2 heads)",
                          "mean of 6 (by position) and of 2 heads"]
    assert titles[2:] == ["head 0, mean of 6", "head 1, mean of 6"]
