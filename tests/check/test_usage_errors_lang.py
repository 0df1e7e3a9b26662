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
