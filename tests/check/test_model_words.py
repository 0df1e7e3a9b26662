"""The sentences ``check_model`` writes about a transformers model itself (facts about its
own mask code, the position limit, decoding not applicable, an implementation that cannot
be loaded, layers not checked) come from the catalogue: read in Chinese, they are Chinese,
with only names and figures as written. Before, they were finished English sentences that
a Chinese report printed as they were."""

from __future__ import annotations

import copy
import importlib.util
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="check model needs `pip install attnkit[transformers]`")

from attnkit.check import check_model  # noqa: E402
from attnkit.check.catalogue import render  # noqa: E402
from attnkit.check.model.load import tiny_model  # noqa: E402
from attnkit.check.model.zoo import zoo_model  # noqa: E402
from attnkit.cli import main  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_the_position_limit_is_said_in_chinese():
    report = check_model(tiny_model("gpt2"), length=80, implementations=["eager"])
    status = render(report.implementations[0].status, "zh")
    assert "超过了这个模型的 n_positions = 64" in status and "--length" in status, status
    assert "positions" not in status.replace("n_positions", ""), status


def test_decoding_not_applicable_is_a_note_in_chinese_in_the_text_and_the_json():
    try:
        model = zoo_model("bert")
    except LookupError as err:
        pytest.skip(str(err))
    report = check_model(model, generate=1, implementations=["eager"])
    text = report.text(lang="zh", reproducers=False)
    assert "  注：解码不适用：BertModel 没有语言模型头" in text, text
    notes = json.loads(report.to_json("zh"))["notes"]
    assert notes == ["解码不适用：BertModel 没有语言模型头（logits）；只检查了预填充"], notes
    assert json.loads(report.to_json())["notes"][0].startswith("decoding not applicable")


def test_the_model_own_mask_is_a_note_in_chinese():
    """CLIP's text model builds its causal mask itself while its modules say
    ``is_causal=False``: a fact about the model, said in the report's language."""
    try:
        model = zoo_model("clip_text_model")
    except LookupError as err:
        pytest.skip(str(err))
    report = check_model(model, implementations=["eager"], padding="none")
    notes = [render(n, "zh") for n in report.notes]
    assert notes and all("由模型的代码自己构造" in n and "按模型自己的代码构造的掩码来判定" in n
                         for n in notes), notes


def test_layers_not_checked_are_the_reason_in_chinese():
    model = copy.deepcopy(tiny_model("llama"))
    attn = model.model.layers[1].self_attn
    attn.config = copy.copy(attn.config)
    attn.config._attn_implementation = "eager"  # computed inline, not through the interface
    report = check_model(model, implementations=["eager"])
    reason = render(report.reason, "zh")
    assert reason == "在 eager 下有 1 个注意力层未检查：model.layers.1.self_attn", reason


def test_an_implementation_that_cannot_be_loaded_is_named_in_chinese(capsys):
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash-attn is installed here")
    code = main(["check", "model", "--tiny", "llama", "--implementations",
                 "sdpa,flash_attention_2", "--lang", "zh"])
    last = capsys.readouterr().out.splitlines()[-1]
    assert code != 0
    assert last.startswith("未通过：无法加载 flash_attention_2："), last


def test_a_refused_command_says_why_in_chinese(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["check", "model", str(tmp_path / "absent"), "--lang", "zh"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "既不是含有 config.json 的本地文件夹" in err and "downloads" not in err, err


def test_a_refused_argument_is_english_for_python_and_chinese_on_request():
    with pytest.raises(ValueError) as raised:
        check_model(tiny_model("llama"), generate=-1)
    assert str(raised.value) == "generate must be >= 0, got -1"
    assert render(raised.value.args[0], "zh") == "generate 必须 >= 0，收到的是 -1"


def test_more_than_three_layers_not_checked_are_counted_in_each_language():
    from attnkit.check.model.report import ImplementationResult, LayerRow, ModelReport

    rows = [LayerRow(f"h.{i}.attn", verdict="not checked") for i in range(5)]
    report = ModelReport("m", implementations=[ImplementationResult("sdpa", layers=rows)])
    assert report.reason == ("5 attention layer(s) not checked under sdpa: h.0.attn, h.1.attn, "
                             "h.2.attn and 2 more")
    assert render(report.reason, "zh") == ("在 sdpa 下有 5 个注意力层未检查：h.0.attn、h.1.attn、"
                                           "h.2.attn 等，另有 2 个")
