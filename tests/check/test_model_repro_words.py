"""The reproducers of ``check_model``: their form follows what the finding found (not the
words of its sentence), and in a Chinese report their comments, printed words and
assertion messages are Chinese while the code stays the same and still fails as printed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers",
                    reason="check model needs `pip install attnkit[transformers]`")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lookalikes as L  # noqa: E402
from model_faults import register_faults  # noqa: E402

from attnkit.check import check_model  # noqa: E402
from attnkit.check.catalogue import render, words  # noqa: E402
from attnkit.check.model.load import tiny_model  # noqa: E402

register_faults()

CJK = re.compile(r"[\u4e00-\u9fff]")


def _window_finding():
    report = check_model(tiny_model("mistral", "float32"),
                         implementations=["sdpa", "fault-no-window"], padding="none")
    (f,) = report.findings("fault-no-window")
    assert f.code == "mask-mismatch" and f.key is None, report.table()
    return f


def _pair_finding():
    report = check_model(tiny_model("llama", "float32"), implementations=["fault-no-window"],
                         padding="left")
    (f,) = report.findings("fault-no-window")
    assert f.code == "mask-mismatch" and f.key == 0, report.table()
    return f


def _fill_finding(tmp_path: Path):
    torch.manual_seed(0)
    model = L.GPT().to(torch.float16)
    report = check_model(model, (L.tokens(),), implementation={"blocks.1.attn":
                                                               L.fill_minus_1e9},
                         save_to=tmp_path)
    (f,) = report.implementations[0].findings
    assert f.code == "float16-overflow", report.text()
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


def _comments(text: str) -> list[str]:
    """What a reader reads in a reproducer: its comments and the words it prints."""
    found = [line.split("# ", 1)[1] for line in text.splitlines() if "# " in line]
    found += re.findall(r"print\('([^']*)'", text)
    return found


@pytest.mark.parametrize("which", ("window", "pair", "fill"))
def test_a_reproducer_in_chinese_has_chinese_comments_and_fails_the_same(
        which, tmp_path, english_in):
    f = {"window": _window_finding, "pair": _pair_finding,
         "fill": lambda: _fill_finding(tmp_path)}[which]()
    en, zh = render(f.reproducer, "en"), render(f.reproducer, "zh")
    assert en == f.reproducer
    def code(text: str) -> list[str]:  # comments and strings taken out
        return [re.sub(r"#.*|'[^']*'|\"[^\"]*\"", "", line) for line in text.splitlines()]

    assert code(zh) == code(en)
    comments = _comments(zh)
    assert comments, zh
    assert all(not english_in(c) for c in comments), zh  # a shape comment is code
    assert sum(bool(CJK.search(c)) for c in comments) >= 2, zh
    if which == "pair":  # the assertion's message is the finding's, in Chinese
        assert repr(render(f.message, "zh")) in zh
    expected = RuntimeError if which == "fill" else AssertionError
    with pytest.raises(expected):
        exec(zh, {})


def test_json_in_chinese_writes_the_reproducer_in_chinese():
    import json

    report = check_model(tiny_model("mistral", "float32"),
                         implementations=["fault-no-window"], padding="none")
    (f,) = report.findings("fault-no-window")
    (item,) = json.loads(report.to_json("zh"))["implementations"][0]["findings"]
    assert item["reproducer"] == render(f.reproducer, "zh") != f.reproducer
    assert "参考实现" in item["reproducer"]
    (item,) = json.loads(report.to_json("en"))["implementations"][0]["findings"]
    assert item["reproducer"] == f.reproducer
