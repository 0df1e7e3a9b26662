"""A ``--convention`` that does not fit a multi-head module is a usage error, and like every
usage error of ``attnkit check`` it is said in the report's language: the check raised it
as an English f-string, so ``--lang zh`` printed an English sentence after ``错误：``."""

from __future__ import annotations

import re
import textwrap

import pytest

pytest.importorskip("torch")

from attnkit.cli import main  # noqa: E402

CJK = re.compile(r"[\u4e00-\u9fff]")
MODULE = textwrap.dedent('''
    import torch
    from torch import nn


    class NoMask(nn.Module):
        def __init__(self, embed_dim, num_heads):
            super().__init__()
            self.attn = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0]
''')


@pytest.mark.parametrize("convention", ["keep", "sdpa"])
def test_a_convention_that_does_not_fit_is_said_in_the_language(convention, tmp_path, capsys,
                                                                 english_in):
    path = tmp_path / "no_mask.py"
    path.write_text(MODULE)
    argv = ["check", "multi-head", f"{path}:NoMask", "--convention", convention]
    with pytest.raises(SystemExit) as exc:
        main(argv + ["--lang", "zh"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("attnkit check：错误：") and err.count("\n") == 1, err
    assert not english_in(err.replace("attnkit check", "")), (english_in(err), err)

    with pytest.raises(SystemExit):
        main(argv)
    english = capsys.readouterr().err
    assert english.startswith("attnkit check: error: ") and not CJK.search(english), english
    assert convention in english, english


FUNCTIONS = textwrap.dedent('''
    import numpy as np


    def softmax(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


    def sdpa_like(q, k, v, attn_mask=None, is_causal=False):
        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
        return softmax(s) @ v


    def masked_softmax(x, mask):
        return softmax(np.where(mask, x, -np.inf))
''')


@pytest.mark.parametrize("argv", [
    ["softmax", "softmax", "--convention", "valid_lens"],
    ["masked-softmax", "softmax"],
    ["attention", "sdpa_like", "--convention", "sdpa", "--causal"],
    ["masked-softmax", "masked_softmax", "--convention", "keep", "--per-query-lens"],
], ids=["softmax-mask", "masked-none", "causal-sdpa", "per-query-lens"])
def test_a_function_convention_that_does_not_fit_is_said_in_the_language(argv, tmp_path, capsys,
                                                                          english_in):
    path = tmp_path / "fns.py"
    path.write_text(FUNCTIONS)
    argv = ["check", argv[0], f"{path}:{argv[1]}", *argv[2:]]
    with pytest.raises(SystemExit) as exc:
        main(argv + ["--lang", "zh"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("attnkit check：错误：") and err.count("\n") == 1, err
    assert not english_in(err.replace("attnkit check", "")), (english_in(err), err)

    with pytest.raises(SystemExit):
        main(argv)
    english = capsys.readouterr().err
    assert english.startswith("attnkit check: error: ") and not CJK.search(english), english


def test_the_python_api_raises_in_the_current_language():
    from attnkit.check import check_softmax
    from attnkit.check.catalogue import set_language

    with pytest.raises(ValueError, match="convention must be"):
        check_softmax(lambda x: x, convention="keep")
    set_language("zh")
    with pytest.raises(ValueError, match="约定只能是"):
        check_softmax(lambda x: x, convention="keep")
