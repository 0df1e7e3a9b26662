"""attnkit check's reports in any language of the catalogue: every code and every sentence
once per language, as templates with named fields (no translation by replacing phrases), the
same codes and figures in either language (``--lang zh``, ``report.text(lang="zh")``,
``ATTNKIT_LANG``)."""

from __future__ import annotations

import json
import os
import re
import string
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnkit.check import CODES, Finding, Report, check_softmax
from attnkit.check.catalogue import (
    CATALOGUE,
    LANGUAGES,
    T,
    code_words,
    get_language,
    join,
    render,
    set_language,
    words,
)

CJK = re.compile(r"[\u4e00-\u9fff]")
ROOT = Path(__file__).resolve().parents[2]


def cjk_share(text: str) -> float:
    """Chinese characters / (Chinese characters + Latin letters), code names left out
    (``self.training``, ``F.dropout``, ``eval()``: words a reader meets in code)."""
    text = re.sub(r"[\w.]*[._()=][\w.()=]*", " ", text)
    cjk = len(CJK.findall(text))
    latin = len(re.findall(r"[A-Za-z]", text))
    return cjk / max(1, cjk + latin)


def zh_code(code: str) -> tuple[str, str]:
    cw = code_words(code, "zh")
    return cw["title"], cw["what"] + cw["fix"]


def naive_softmax(x):
    e = np.exp(x)                        # no max subtracted: overflows at logits ~1e3
    return e / e.sum(axis=-1, keepdims=True)


def fields_of(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def test_every_code_has_its_words_in_every_language():
    assert list(CODES) == list(CATALOGUE)
    for lang in LANGUAGES:
        for code in CATALOGUE:
            cw = code_words(code, lang)
            assert set(cw) == {"title", "what", "why", "fix"}, (lang, code)
            assert all(cw.values()), (lang, code)
    for code in CATALOGUE:
        title, diagnosis = zh_code(code)
        assert len(CJK.findall(title)) >= 2, (code, title)
        assert cjk_share(diagnosis) > 0.5, (code, diagnosis)  # English text scores ~0


def test_every_language_has_every_sentence_with_the_same_fields():
    en = words("en")
    for lang in LANGUAGES:
        theirs = words(lang)
        assert set(theirs) == set(en), (lang, sorted(set(theirs) ^ set(en)))
        for key, template in en.items():
            assert fields_of(theirs[key]) == fields_of(template), (lang, key)


def test_the_chinese_sentences_are_chinese(english_in):
    for key, template in words("zh").items():
        text = re.sub(r"\{[^{}]*\}", "…", template)  # its fields are written as they are
        assert not english_in(text), (key, template)
    for code in CATALOGUE:
        assert not english_in(" ".join(code_words(code, "zh").values())), code


def test_the_check_for_english_sees_sentences_not_code(english_in):
    assert english_in("详情：the mask is read the other way round")
    assert not english_in("请用 `attnkit check attention` 检查 x.view(B, T, H, Dk).transpose(1, 2)")
    assert not english_in("NumPy 数组和 PyTorch 张量，(B, H, T, D)、(B, T, D) 和 (B, T, H, D)")


def test_the_catalogue_is_written_in_the_terms_of_the_chapters():
    text = "".join("".join(code_words(c, "zh").values()) for c in CATALOGUE)
    text += "".join(words("zh").values())
    assert "屏蔽" not in text and "遮住" not in text  # the chapters say 掩蔽, as d2l does
    assert "掩蔽" in text and "暂退法" in text and "缩放点积注意力" in text
    # A large negative value written into masked scores: 替换 in the chapters, which keep
    # 填充 for padding.
    assert not re.search(r"填充值|inf 填充|大负数填充|填充被掩蔽|填充为|填充成", text)
    assert "被掩蔽的分数替换" in text
    assert "大负数 -1e9" in render(T("overflow.fill-here", value="-1e9"), "zh")


def test_a_sentence_is_a_template_and_renders_in_each_language():
    text = T("judge.scale", scaled=T("scale.none"), default=0.5)
    assert text == "the scores are not scaled (1/sqrt(Dk) is missing); scaled dot-product " \
        "attention uses 1/sqrt(Dk) = 0.5"
    assert render(text, "zh") == "注意力分数没有缩放（缺了 1/sqrt(Dk)）；缩放点积注意力用的是 " \
        "1/sqrt(Dk) = 0.5"
    both = T("report.running-module") + T("header.declared")
    assert render(both, "zh") == "模块（已声明为因果）" and both == "the module (declared causal)"
    assert render(join(["a", T("case.basic")]), "zh") == "a；基本"
    assert render("as written", "zh") == "as written"


def test_a_chinese_report_has_chinese_words_and_the_same_codes_and_figures():
    report = check_softmax(naive_softmax)
    en, zh = report.text(lang="en"), report.text(lang="zh")
    assert report.codes == ["nan-or-inf"]
    assert en.startswith("attnkit check softmax") and "FAILED" in en
    assert zh.startswith("attnkit 检查 softmax") and words("zh")["report.failed"] in zh
    title, diagnosis = zh_code("nan-or-inf")
    assert f"nan-or-inf：{title}" in zh and diagnosis in zh
    finding = report.findings[0]
    assert finding.measured in en and finding.case in en and finding.message in en
    assert render(finding.measured, "zh") in zh and render(finding.case, "zh") in zh
    assert "输出的 6 个值中有 6 个不是有限值" in zh  # the detail, in Chinese too
    assert finding.reproducer.splitlines()[0] in zh
    assert "framework" not in zh and "cases in" not in zh and "reproducer for" not in zh
    # Everything before the reproducer is Chinese, but for names, figures and shapes.
    prose = zh.split(words("zh")["report.reproducer"].format(code="nan-or-inf"))[0]
    assert cjk_share("\n".join(prose.splitlines()[1:])) > 0.5, prose


def test_a_clean_report_in_chinese():
    report = check_softmax(lambda x: np.exp(x - x.max(-1, keepdims=True))
                           / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
    assert report.ok and not report.codes
    zh = report.text(lang="zh")
    assert words("zh")["report.no-findings"] in zh and words("zh")["report.ok"] in zh


def test_every_code_renders_in_both_languages():
    report = Report("attention", "fn", framework="torch",
                    convention=T("header.convention", name="keep", how=T("how.from behaviour")),
                    layout="(B, H, T, D)", causality=T("header.bidirectional"),
                    origin=T("build.built-as", expr="Mine(h=4, d_model=16)"))
    for code in CODES:
        report.add(Finding(code, T("judge.beyond-rule", dtype="float32"),
                           T("measured.max-change", value=1.0), T("case.basic")))
    en, zh = report.text(lang="en"), report.text(lang="zh")
    for code in CODES:
        assert code in en and code in zh
        assert code_words(code, "zh")["title"] in zh
        assert f"docs/check-codes.md#{code}" in en and f"docs/check-codes.md#{code}" in zh
    assert "（由行为判断）" in zh and "双向" in zh and "构造方式：" in zh
    assert "max change 1" in en and "最大变化 1" in zh


def test_json_in_chinese_keeps_the_codes_and_adds_the_chinese_text():
    report = check_softmax(naive_softmax)
    en, zh = json.loads(report.to_json()), json.loads(report.to_json("zh"))
    assert [f["code"] for f in en["findings"]] == [f["code"] for f in zh["findings"]]
    assert "title" not in en["findings"][0]
    assert en["findings"][0]["doc"] == zh["findings"][0]["doc"] == "docs/check-codes.md#nan-or-inf"
    assert (zh["findings"][0]["title"], zh["findings"][0]["diagnosis"]) == zh_code("nan-or-inf")
    assert en["findings"][0]["measured"] == "6 of 6 values non-finite in the output"
    assert zh["findings"][0]["measured"] == "输出的 6 个值中有 6 个不是有限值"


def test_print_follows_set_language_then_the_environment(monkeypatch):
    report = check_softmax(naive_softmax)
    assert get_language() == "en" and str(report).startswith("attnkit check")
    monkeypatch.setenv("ATTNKIT_LANG", "zh")
    assert get_language() == "zh" and str(report).startswith("attnkit 检查")
    set_language("en")
    assert str(report).startswith("attnkit check")
    monkeypatch.setenv("ATTNKIT_LANG", "klingon")  # not a language we write: English
    set_language(None)
    assert get_language() == "en"


def test_an_unknown_language_is_refused():
    report = check_softmax(naive_softmax)
    with pytest.raises(ValueError, match="lang must be one of"):
        report.text(lang="fr")
    with pytest.raises(ValueError, match="lang must be one of"):
        set_language("fr")


def test_the_command_prints_chinese_with_lang_zh(tmp_path):
    (tmp_path / "mine.py").write_text(
        "import numpy as np\n\n\ndef softmax(x):\n    e = np.exp(x)\n"
        "    return e / e.sum(axis=-1, keepdims=True)\n")
    env = {k: v for k, v in os.environ.items() if k != "ATTNKIT_LANG"}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "attnkit", "check", "softmax",
                               "mine.py:softmax", *extra], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)

    zh, en = run("--lang", "zh"), run()
    assert zh.returncode == en.returncode == 1
    assert zh.stdout.startswith("attnkit 检查 softmax") and zh_code("nan-or-inf")[1] in zh.stdout
    assert en.stdout.startswith("attnkit check softmax")
    as_json = json.loads(run("--lang", "zh", "--json").stdout)
    assert as_json["findings"][0]["code"] == "nan-or-inf"
    assert as_json["findings"][0]["title"] == zh_code("nan-or-inf")[0]
    bad = run("--lang", "fr")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
