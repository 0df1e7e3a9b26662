"""`attnkit view MODEL --text ...` draws what the model's attention could see: future keys
of a causal model as masked (grey stripes), not as weight 0, and its key/value heads."""

from __future__ import annotations

import base64
import json
import re
import zlib

import numpy as np
import pytest

import attnkit.numpy as an
from attnkit.viz.view import model_structure, view_file


def page_data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="attnkit-data">(.*?)</script>', page,
                  re.S)
    assert m, "no data element in the page"
    return json.loads(m.group(1))


def page_mask(data: dict, layer: int, head: int) -> np.ndarray:
    """The ``(Tq, Tk)`` keep-mask of one head as the page stores it (bit-packed)."""
    m = data["mask"]
    bits = zlib.decompress(base64.b64decode(
        m["data"][layer if m["L"] > 1 else 0][head if m["H"] > 1 else 0]))
    n = data["Tq"] * data["Tk"]
    return np.unpackbits(np.frombuffer(bits, np.uint8))[:n].reshape(data["Tq"], data["Tk"]) > 0


def _tiny_model(tmp_path, family: str = "llama"):
    """A saved 2-layer model with 4 query heads sharing 2 key/value heads, and a
    word-level tokenizer, in a folder."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    pytest.importorskip("torch")
    words = ["[UNK]", "the", "cat", "sat", "on", "mat"]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    sizes = dict(vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                 pad_token_id=0, bos_token_id=None, eos_token_id=None)
    config = (transformers.LlamaConfig(**sizes) if family == "llama"
              else transformers.MistralConfig(sliding_window=3, **sizes))
    model = transformers.AutoModelForCausalLM.from_config(config)
    folder = tmp_path / family
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def test_view_of_a_causal_gqa_model_passes_its_mask_and_kv_heads(tmp_path):
    folder = _tiny_model(tmp_path)
    page = view_file(str(folder), tmp_path / "out", text="the cat sat on the mat")
    data = page_data(page.read_text(encoding="utf-8"))
    assert (data["L"], data["H"], data["Hkv"], data["Tq"]) == (2, 4, 2, 6)
    assert data["mask"] is not None, "the page carries no mask: future keys would look white"
    for layer in range(2):
        for head in range(4):
            np.testing.assert_array_equal(page_mask(data, layer, head), an.causal_mask(6, 6))


def test_model_structure_reads_causal_windows_and_kv_heads(tmp_path):
    from attnkit.integrations.transformers import attentions_for_text

    for family, window in (("llama", None), ("mistral", 3)):
        folder = _tiny_model(tmp_path, family)
        attentions, tokens = attentions_for_text(str(folder), "the cat sat on the mat")
        got = model_structure(str(folder), attentions)
        assert got["kv_heads"] == 2, family
        want = an.causal_mask(6, 6)
        if window is not None:
            want = want & an.window_mask(6, 6, window - 1, 0)
        np.testing.assert_array_equal(got["mask"], np.broadcast_to(want, (2, 1, 6, 6)))


def test_model_structure_draws_no_mask_the_weights_contradict(tmp_path):
    folder = _tiny_model(tmp_path)
    rng = np.random.default_rng(0)
    dense = [an.softmax(rng.normal(size=(1, 4, 6, 6))) for _ in range(2)]  # not causal
    got = model_structure(str(folder), dense)
    assert got == {"kv_heads": 2}


def test_a_loader_may_return_the_structure(tmp_path):
    keep = an.causal_mask(3, 3)
    rng = np.random.default_rng(1)
    att = tuple(an.masked_softmax(rng.normal(size=(1, 4, 3, 3)), mask=keep) for _ in range(2))

    def loader(model: str, text: str):
        return att, text.split(), {"mask": keep, "kv_heads": 1}

    page = view_file("org/tiny", tmp_path, text="a b c", model_loader=loader)
    data = page_data(page.read_text(encoding="utf-8"))
    assert data["Hkv"] == 1
    np.testing.assert_array_equal(page_mask(data, 1, 3), keep)
