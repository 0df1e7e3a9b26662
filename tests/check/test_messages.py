"""attnkit check's reports in Chinese: one catalogue for both languages, every code in it,
the same codes and figures in either language (``--lang zh``, ``report.text(lang="zh")``,
``ATTNKIT_LANG``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnkit.check import CODES, Finding, Report, check_softmax
from attnkit.check.catalogue.messages import (
    ZH_CODES,
    ZH_PHRASES,
    ZH_WORDS,
    get_language,
    set_language,
    zh_phrases,
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


def naive_softmax(x):
    e = np.exp(x)                        # no max subtracted: overflows at logits ~1e3
    return e / e.sum(axis=-1, keepdims=True)


def test_every_code_has_a_chinese_title_and_diagnosis():
    missing = sorted(set(CODES) - set(ZH_CODES))
    assert not missing, f"codes with no Chinese text in attnkit.check.catalogue.messages: {missing}"
    assert not sorted(set(ZH_CODES) - set(CODES)), "Chinese text for a code CODES lacks"
    for code, (title, diagnosis) in ZH_CODES.items():
        assert title and diagnosis, code
        assert len(CJK.findall(title)) >= 2, (code, title)
        assert cjk_share(diagnosis) > 0.5, (code, diagnosis)  # English text scores ~0


def test_the_catalogue_is_written_in_the_terms_of_the_chapters():
    text = "".join(t + d for t, d in ZH_CODES.values())
    assert "屏蔽" not in text and "遮住" not in text  # the chapters say 掩蔽, as d2l does
    assert "掩蔽" in text and "暂退法" in text


def test_a_chinese_report_has_chinese_words_and_the_same_codes_and_figures():
    report = check_softmax(naive_softmax)
    en, zh = report.text(lang="en"), report.text(lang="zh")
    assert report.codes == ["nan-or-inf"]
    assert en.startswith("attnkit check softmax") and "FAILED" in en
    assert zh.startswith("attnkit 检查 softmax") and ZH_WORDS["failed"] in zh
    title, diagnosis = ZH_CODES["nan-or-inf"]
    assert f"nan-or-inf：{title}" in zh and diagnosis in zh
    finding = report.findings[0]
    assert finding.measured in zh and finding.case in zh
    assert finding.reproducer.splitlines()[0] in zh
    assert "framework" not in zh and "cases in" not in zh and "reproducer for" not in zh
    # The prose around the English detail, reproducer and names is Chinese.
    prose = zh.split(ZH_WORDS["reproducer"].format(code="nan-or-inf"))[0]
    prose = "\n".join(line for line in prose.splitlines()[1:] if ZH_WORDS["detail"] not in line
                      and ZH_WORDS["measured"] not in line and ZH_WORDS["case"] not in line)
    assert cjk_share(prose) > 0.5, prose


def test_a_clean_report_in_chinese():
    report = check_softmax(lambda x: np.exp(x - x.max(-1, keepdims=True))
                           / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
    assert report.ok and not report.codes
    zh = report.text(lang="zh")
    assert ZH_WORDS["no findings"] in zh and ZH_WORDS["ok"] in zh


def test_every_code_renders_in_both_languages():
    report = Report("attention", "fn", framework="torch", convention="keep (from behaviour)",
                    layout="(B, H, T, D)", causality="bidirectional: later positions change "
                    "earlier outputs", origin="built as Mine(h=4, d_model=16)")
    for code in CODES:
        report.add(Finding(code, f"the English sentence of {code}", "measured 1", "case 1"))
    en, zh = report.text(lang="en"), report.text(lang="zh")
    for code in CODES:
        assert code in en and code in zh
        assert ZH_CODES[code][0] in zh
    assert "（由行为判断）" in zh and "双向" in zh and "构造方式：" in zh


def test_json_in_chinese_keeps_the_codes_and_adds_the_chinese_text():
    report = check_softmax(naive_softmax)
    en, zh = json.loads(report.to_json()), json.loads(report.to_json("zh"))
    assert [f["code"] for f in en["findings"]] == [f["code"] for f in zh["findings"]]
    assert "title" not in en["findings"][0]
    assert zh["findings"][0]["title"] == ZH_CODES["nan-or-inf"][0]
    assert zh["findings"][0]["diagnosis"] == ZH_CODES["nan-or-inf"][1]


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


def test_phrases_leave_names_and_shapes_alone():
    assert zh_phrases("keep (from behaviour), passed as attn_mask= (B, Tq, Tk)") == \
        "keep（由行为判断），作为 attn_mask= (B, Tq, Tk)"
    assert all(en and zh for en, zh in ZH_PHRASES)
    judged = zh_phrases("behaves as causal (judged as causal; pass --causal to declare it)")
    assert judged == "表现为因果（按因果注意力来判；可用 --causal 声明）"
    assert "JAX" in zh_phrases("(B, T, H, D) in and out, heads on axis 2 as JAX and flash-attn "
                               "take them (transposed to judge it)").split("，")[2]


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
    assert zh.stdout.startswith("attnkit 检查 softmax") and ZH_CODES["nan-or-inf"][1] in zh.stdout
    assert en.stdout.startswith("attnkit check softmax")
    as_json = json.loads(run("--lang", "zh", "--json").stdout)
    assert as_json["findings"][0]["code"] == "nan-or-inf"
    assert as_json["findings"][0]["title"] == ZH_CODES["nan-or-inf"][0]
    bad = run("--lang", "fr")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
