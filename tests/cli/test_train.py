"""`attnkit train`: the model learns to align, seeded and reproducible, at small settings."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="attnkit train needs torch")

from attnkit import cli, seq2seq  # noqa: E402

ACCURACY_LINE = re.compile(r"^exact-match accuracy: (\d\.\d{3})$")


def test_cli_defaults_match_train_config():
    """cli keeps its own copy of the defaults (so --help never imports torch)."""
    defaults = {f.name: f.default for f in dataclasses.fields(seq2seq.TrainConfig)}
    assert cli.DEFAULTS == defaults
    assert cli.TRAIN_TASKS == seq2seq.TASKS and cli.TRAIN_MODELS == seq2seq.MODELS


@pytest.mark.parametrize("task, expected", [
    ("reverse", [[5, 0, 3, 1], [2, 2, 9, 7]]),
    ("copy", [[1, 3, 0, 5], [7, 9, 2, 2]]),
    ("sort", [[0, 1, 3, 5], [2, 2, 7, 9]]),
])
def test_task_targets(task, expected):
    src = np.array([[1, 3, 0, 5], [7, 9, 2, 2]])
    np.testing.assert_array_equal(seq2seq.targets_for(task, src), expected)


def test_reversal_learns_to_align(tmp_path, capsys, check_png):
    """A short default-shaped run: accuracy above a floor, the anti-diagonal in the weights."""
    rc = cli.main(["train", "--task", "reverse", "--steps", "300", "--eval-size", "300",
                   "--out", str(tmp_path)])
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    match = ACCURACY_LINE.match(lines[-1])
    assert match, lines[-1]
    assert float(match.group(1)) >= 0.6, lines[-1]
    assert any(line.startswith("step 300/300 [") for line in lines)  # the progress report
    png = tmp_path / "train_reverse_additive.png"
    assert f"wrote {png}" in lines
    check_png(png)


def test_reversal_weights_sit_on_the_anti_diagonal():
    cfg = seq2seq.TrainConfig(steps=300, eval_size=200)
    result = seq2seq.train(cfg)
    mean = result.eval_weights.mean(0).numpy()  # (T, T): output step x input position
    T = cfg.length
    assert mean.shape == (T, T)
    np.testing.assert_allclose(mean.sum(-1), 1.0, atol=1e-5)
    # Output step t reads input T-1-t: the anti-diagonal carries most of each row's mass.
    assert mean[np.arange(T), T - 1 - np.arange(T)].mean() > 0.3
    assert (mean.argmax(-1) == T - 1 - np.arange(T)).mean() >= 0.8


def test_mha_model_trains_and_plots_heads(tmp_path, capsys, check_png):
    rc = cli.main(["train", "--model", "mha", "--task", "copy", "--length", "6",
                   "--hidden", "32", "--heads", "2", "--steps", "200", "--eval-size", "200",
                   "--out", str(tmp_path)])
    assert rc == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    match = ACCURACY_LINE.match(last)
    assert match and float(match.group(1)) >= 0.5, last
    check_png(tmp_path / "train_copy_mha.png")


def test_training_is_reproducible():
    cfg = seq2seq.TrainConfig(steps=15, hidden=16, batch_size=16, eval_size=20, seed=3)
    a, b = seq2seq.train(cfg), seq2seq.train(cfg)
    assert a.losses == b.losses
    assert torch.equal(a.eval_pred, b.eval_pred)
    c = seq2seq.train(dataclasses.replace(cfg, seed=4))
    assert c.losses != a.losses


def test_train_restores_torch_threads():
    before = torch.get_num_threads()
    seq2seq.train(seq2seq.TrainConfig(steps=2, hidden=8, batch_size=4, eval_size=4,
                                      threads=before + 1))
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("bad", [{"task": "shuffle"}, {"steps": 0}, {"model": "rnn"},
                                 {"lr": float("nan")}, {"model": "mha", "hidden": 6}])
def test_train_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        seq2seq.TrainConfig(**bad)
