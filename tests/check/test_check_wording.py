"""Small wording of ``attnkit check``: counts in the singular where there is one, and what
the help says ``check model`` takes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from attnkit.check import check_multi_head, load_target  # noqa: E402

FILE = "tests/check/impl_calls/oracle_modules.py"


@pytest.mark.usefixtures("at_root")
def test_one_key_value_head_is_said_in_the_singular():
    gqa = load_target(f"{FILE}:GroupedQuery")

    def multi_query(embed_dim, num_heads):  # every query head reads the one k/v head
        return gqa(embed_dim, num_heads, n_kv_heads=1)

    report = check_multi_head(multi_query)
    assert report.findings == [], report.text()
    assert "4 heads of 4, 1 key/value head," in report.oracle["structure"], report.oracle
    assert "1 个键/值头" in report.text(lang="zh")


@pytest.mark.parametrize("lang, words", [("en", "any PyTorch model as FILE.py:NAME"),
                                         ("zh", "任意PyTorch模型")])
def test_the_help_says_check_model_takes_any_pytorch_model(lang, words, capsys):
    from attnkit.cli import main

    with pytest.raises(SystemExit):
        main(["check", "--help", "--lang", lang])
    epilog = capsys.readouterr().out.split("attnkit check model MODEL")[-1]
    flat = " ".join(epilog.split()) if lang == "en" else "".join(epilog.split())
    assert words in flat, epilog
