"""attnkit.gpt: the small GPT of the course's chapter 9."""

from __future__ import annotations

import math

import pytest
import torch

import attnkit.gpt as gpt
from attnkit.torch import PositionalEncoding


def tiny(vocab: int = 11, **sizes) -> gpt.GPT:
    torch.manual_seed(0)
    config = gpt.GPTConfig(vocab, **{"context": 16, "embed_dim": 16, "num_heads": 4,
                                     "num_layers": 2, **sizes})
    return gpt.GPT(config).eval()


def test_positions_are_chapter_0s_sinusoids():
    for E in (16, 7):
        expected = PositionalEncoding(E, dropout=0.0).P[0, :20]
        torch.testing.assert_close(gpt.sinusoids(20, E), expected, rtol=0, atol=1e-6)


def test_the_model_is_causal():
    model = tiny()
    ids = torch.randint(0, 11, (2, 9))
    edited = ids.clone()
    edited[:, 6:] = (edited[:, 6:] + 1) % 11
    with torch.no_grad():
        a, b = model(ids), model(edited)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_the_cache_gives_the_same_tokens_and_logits(temperature):
    model = tiny()
    prompt = torch.tensor([1, 2, 3])
    slow = gpt.generate(model, prompt, 12, temperature=temperature, use_cache=False, seed=3)
    fast = gpt.generate(model, prompt, 12, temperature=temperature, use_cache=True, seed=3)
    assert torch.equal(slow, fast) and slow.shape == (15,)
    assert torch.equal(slow[:3], prompt)
    caches = model.init_caches(1)
    with torch.no_grad():
        step_by_step = torch.cat([model(fast[None, :8], caches)] +
                                 [model(fast[None, t:t + 1], caches) for t in range(8, 15)], 1)
        torch.testing.assert_close(step_by_step, model(fast[None]), rtol=1e-5, atol=1e-5)


def test_the_context_is_a_limit():
    model = tiny()
    assert gpt.generate(model, torch.tensor([1, 2]), 15).shape == (17,)  # reads 16
    with pytest.raises(ValueError, match="17 positions exceed the context 16"):
        gpt.generate(model, torch.tensor([1, 2]), 16)


def test_training_lowers_the_loss_and_restores_the_threads():
    text = "the cat sat on the mat. " * 40
    tok = gpt.CharTokenizer(text)
    model = tiny(len(tok))
    threads = torch.get_num_threads()
    losses = gpt.train(model, tok.encode(text), steps=200, batch_size=8, progress=False)
    assert torch.get_num_threads() == threads
    assert losses[0] > math.log(len(tok)) - 0.5 and sum(losses[-5:]) / 5 < 1.0, losses[::10]
    assert not model.training
    sample = tok.decode(gpt.generate(model, tok.encode("the c"), 10))
    assert sample.startswith("the cat sat"), sample


def test_the_progress_bar_shows_the_loss(capsys):
    text = "abcabcabc" * 20
    tok = gpt.CharTokenizer(text)
    losses = gpt.train(tiny(len(tok)), tok.encode(text), steps=4, batch_size=2)
    err = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()
    assert "4/4" in err[-1] and f"loss={losses[-1]:.3f}" in err[-1], err[-1]


def test_a_model_of_your_own_blocks_trains_but_keeps_no_cache():
    class Identity(torch.nn.Module):
        def __init__(self, embed_dim, num_heads):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(embed_dim))

        def forward(self, x):
            return x * self.scale

    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(5, context=8, embed_dim=8), block=Identity)
    assert len(model.blocks) == 4 and isinstance(model.blocks[0], Identity)
    with pytest.raises(TypeError, match="no KV cache"):
        model.init_caches(1)
    out = gpt.generate(model.eval(), torch.tensor([0]), 5, use_cache=False)
    assert out.shape == (6,)


@pytest.mark.parametrize("lang, first", [("en", "# 0. "), ("zh", "# 0. ")])
def test_the_course_text_is_both_editions_chapters(lang, first):
    text = gpt.course_text(lang)
    assert text.startswith(first)
    assert "# 8. " in text and "# 9. " not in text  # chapters 0-8, not this one
    cjk = sum("\u4e00" <= c <= "\u9fff" for c in text) / len(text)
    assert (cjk > 0.1) == (lang == "zh"), cjk


def test_the_course_text_follows_attnkit_lang(monkeypatch):
    monkeypatch.setenv("ATTNKIT_LANG", "zh")
    assert gpt.course_text() == gpt.course_text("zh")
    monkeypatch.delenv("ATTNKIT_LANG")
    assert gpt.course_text() == gpt.course_text("en")
    with pytest.raises(ValueError, match="'en' or 'zh'"):
        gpt.course_text("fr")


def test_the_course_text_follows_set_language(monkeypatch):
    from attnkit.check import set_language

    monkeypatch.delenv("ATTNKIT_LANG", raising=False)
    set_language("zh")
    try:
        assert gpt.course_text() == gpt.course_text("zh")
    finally:
        set_language(None)
    assert gpt.course_text() == gpt.course_text("en")
