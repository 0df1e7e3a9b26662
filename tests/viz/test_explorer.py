"""attnkit.viz.explorer without a browser: input layouts, the page's data (decoded here, in
Python, as the page's script decodes it), the size limit, .npz files and `attnkit view`."""

from __future__ import annotations

import base64
import html
import json
import re
import subprocess
import sys
import zlib

import numpy as np
import pytest

import attnkit.numpy as an
from attnkit.viz.explorer import LEVELS, Explorer, explore, load_npz
from attnkit.viz.view import view_file, view_main


def attention(rng, shape, *, keep=None, spread=2.0) -> np.ndarray:
    """Softmax of random scores, float32, shaped ``shape`` (..., Tq, Tk)."""
    return an.masked_softmax(rng.normal(0.0, spread, size=shape), mask=keep).astype(np.float32)


def page_data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="attnkit-data">(.*?)</script>', page,
                  re.S)
    assert m, "no data element in the page"
    return json.loads(m.group(1))


def decode_head(data: dict, layer: int, head: int) -> np.ndarray:
    """The ``(Tq, Tk)`` weights of one head, read from the page's data."""
    src = data["heads"][layer][head]
    raw = zlib.decompress(base64.b64decode(src["data"]))
    shape = (data["Tq"], data["Tk"])
    if data["precision"] == "float16":
        return np.frombuffer(raw, "<f2").reshape(shape).astype(np.float64)
    step = np.frombuffer(base64.b64decode(src["step"]), "<f4").astype(np.float64)
    return np.frombuffer(raw, np.uint8).reshape(shape) * step[:, None]


def decode_mask(data: dict, layer: int, head: int) -> np.ndarray:
    m = data["mask"]
    bits = zlib.decompress(base64.b64decode(
        m["data"][layer if m["L"] > 1 else 0][head if m["H"] > 1 else 0]))
    n = data["Tq"] * data["Tk"]
    return np.unpackbits(np.frombuffer(bits, np.uint8))[:n].reshape(data["Tq"], data["Tk"]) > 0


# -- input layouts ---------------------------------------------------------------------------
def test_layouts_become_layers_by_heads(rng):
    w = attention(rng, (3, 2, 4, 5, 6))  # (L, B, H, Tq, Tk)
    for given, want in [
        (w[0, 0, 0], w[0, 0, 0][None, None]),          # (Tq, Tk)
        (w[0, 0], w[0, 0][None]),                      # (H, Tq, Tk)
        (w[:, 1], w[:, 1]),                            # (L, H, Tq, Tk)
        (w, w[:, 0]),                                  # (L, B, H, Tq, Tk), batch 0
        (tuple(w[:, 0]), w[:, 0]),                     # one (H, Tq, Tk) per layer
    ]:
        np.testing.assert_array_equal(explore(given).weights, want)
    # transformers' output_attentions: a tuple of (B, H, Tq, Tk) per layer, batch picked.
    per_layer = tuple(np.ascontiguousarray(w[i]) for i in range(3))
    np.testing.assert_array_equal(explore(per_layer, batch=1).weights, w[:, 1])
    np.testing.assert_array_equal(explore(per_layer, batch=-1).weights, w[:, 1])


def test_torch_tensors_are_read_without_grad():
    torch = pytest.importorskip("torch", reason="torch input needs torch")
    w = torch.rand(1, 2, 3, 3, dtype=torch.bfloat16, requires_grad=True)
    ex = explore((w, w * 0.5))
    assert ex.shape == (2, 2, 3, 3)
    np.testing.assert_array_equal(ex.weights[1], (w[0] * 0.5).float().detach().numpy())


def test_tokens_default_and_cross_attention(rng):
    ex = explore(attention(rng, (2, 3, 5)), ["a", "b", "c"])
    assert ex.q_tokens == ("a", "b", "c")
    assert ex.k_tokens == ("0", "1", "2", "3", "4")  # Tq != Tk: keys are not the queries
    ex = explore(attention(rng, (2, 3, 3)), ["a", "b", "c"])
    assert ex.k_tokens == ex.q_tokens  # self-attention
    ex = explore(attention(rng, (2, 3, 5)), k_tokens=list("vwxyz"))
    assert ex.q_tokens == ("0", "1", "2") and ex.k_tokens == tuple("vwxyz")


def test_layers_picks_and_names_layers(rng):
    w = attention(rng, (4, 2, 3, 3))
    keep = np.broadcast_to(an.causal_mask(3, 3), (4, 2, 3, 3)).copy()
    keep[2, 1, 2, 0] = False
    ex = explore(w, layers=[2, -1], mask=keep)
    np.testing.assert_array_equal(ex.weights, w[[2, 3]])
    assert ex.layer_ids == (2, 3)
    np.testing.assert_array_equal(ex.keep(0, 1), keep[2, 1])
    assert page_data(ex.html())["layers"] == [2, 3]


@pytest.mark.parametrize("kwargs, match", [
    ({"weights": np.zeros((2, 2, 2, 2, 2, 2))}, "must be"),
    ({"weights": [np.zeros((2, 3, 3)), np.zeros((2, 3, 4))]}, "one shape"),
    ({"weights": []}, "empty"),
    ({"weights": np.zeros((2, 0, 3))}, "nothing to show"),
    ({"weights": np.full((2, 2), np.nan)}, "NaN"),
    ({"weights": -np.ones((2, 2))}, ">= 0"),
    ({"weights": np.ones((2, 2)), "tokens": ["a"]}, "tokens has 1"),
    ({"weights": np.ones((2, 3)), "k_tokens": ["a"]}, "k_tokens has 1"),
    ({"weights": np.ones((2, 2)), "mask": np.ones((3,), bool)}, "not broadcastable"),
    ({"weights": np.ones((4, 2, 2)), "kv_heads": 3}, "divide"),
    ({"weights": np.ones((1, 1, 2, 2, 2)), "batch": 1}, "batch=1"),
    ({"weights": [np.ones((1, 2, 2, 2))], "batch": 1}, "batch=1"),
    ({"weights": np.ones((2, 2, 2, 2)), "layers": [2]}, "out of range"),
    ({"weights": np.ones((2, 2)), "precision": "int4"}, "precision"),
    ({"weights": np.ones((2, 2)), "view": "graph"}, "view"),
])
def test_bad_input_says_what_is_wrong(kwargs, match):
    with pytest.raises(ValueError, match=match):
        explore(**kwargs)


def test_mask_must_be_bool_and_tokens_a_list():
    with pytest.raises(TypeError, match="True = may attend"):
        explore(np.ones((2, 2)), mask=np.ones((2, 2)))
    with pytest.raises(TypeError, match="not one string"):
        explore(np.ones((2, 2)), "ab")


# -- the page's data -------------------------------------------------------------------------
def test_uint8_page_round_trips_within_half_a_step(rng):
    keep = an.causal_mask(9, 9) & an.sequence_mask(np.array([7]), 9)
    w = attention(rng, (2, 4, 9, 9), keep=keep)
    ex = explore(w, mask=keep, kv_heads=2)
    data = page_data(ex.html())
    assert (data["L"], data["H"], data["Hkv"], data["levels"]) == (2, 4, 2, 255)
    for li in range(2):
        for h in range(4):
            got = decode_head(data, li, h)
            half_step = np.broadcast_to(w[li, h].max(-1, keepdims=True) / 510, keep.shape)
            err = np.abs(got - w[li, h])
            assert np.all(err[keep] <= half_step[keep] * (1 + 1e-6)), \
                f"layer {li} head {h}: max error {err[keep].max():.3g}"
            assert np.all(got[~keep] == 0)  # masked cells read back as 0
            np.testing.assert_array_equal(decode_mask(data, li, h), keep)


def test_float16_page_round_trips_within_half_precision(rng):
    w = attention(rng, (2, 3, 6, 7))
    data = page_data(explore(w, precision="float16").html())
    assert data["levels"] is None and data["mask"] is None
    for li in range(2):
        for h in range(3):
            np.testing.assert_allclose(decode_head(data, li, h), w[li, h], rtol=2**-11)


def test_page_shrinks_steps_to_fit_max_bytes(rng):
    w = attention(rng, (2, 4, 256, 256), spread=0.5)  # broad rows: every code is busy
    full = explore(w, max_bytes=None)
    assert full.levels == 255
    limit = int(full.nbytes * 0.7)
    small = explore(w, max_bytes=limit)
    assert small.levels in LEVELS[1:] and small.nbytes <= limit
    data = page_data(small.html())
    got = decode_head(data, 1, 3)
    step = w[1, 3].max(-1, keepdims=True) / small.levels
    assert np.all(np.abs(got - w[1, 3]) <= step / 2 * (1 + 1e-6))
    with pytest.raises(ValueError, match="over max_bytes"):
        explore(w, max_bytes=10_000).html()
    with pytest.raises(ValueError, match="over max_bytes"):
        explore(w, precision="float16", max_bytes=limit).html()


def test_page_of_12_layers_12_heads_512_tokens_stays_under_20_mb():
    """The issue's size promise, on the hardest input: broad rows (logits N(0, 1)), no mask,
    where one byte per weight cannot fit and the page takes fewer steps per row."""
    rng = np.random.default_rng(0)
    L, H, T = 12, 12, 512
    w = np.empty((L, H, T, T), np.float32)
    for li in range(L):
        s = rng.standard_normal((H, T, T), dtype=np.float32)
        e = np.exp(s - s.max(-1, keepdims=True))
        w[li] = e / e.sum(-1, keepdims=True)
    ex = explore(w, [f"t{i}" for i in range(T)])
    assert ex.nbytes <= 20_000_000, ex.nbytes
    assert ex.levels is not None and ex.levels >= 15


def test_tokens_cannot_break_out_of_the_page():
    nasty = ["</script><script>alert(1)</script>", "a & b", "<!--", '"q"']
    page = explore(np.eye(4), nasty).html()
    assert page.count("</script>") == 3  # the data element and the two scripts
    assert page_data(page)["qTokens"] == nasty


def test_repr_html_is_an_iframe_of_the_page(rng):
    ex = explore(attention(rng, (2, 3, 3)), ["x", "<y>", "z"], title="t & t")
    rep = ex._repr_html_()
    assert rep.startswith("<iframe") and 'srcdoc="' in rep
    assert "<script" not in rep  # the page is escaped inside the attribute
    assert "&lt;script" in rep and 'title="t &amp; t"' in rep


def test_repr_html_carries_the_weights_and_the_mask(rng):
    """What a notebook shows inline is the whole page: the same tokens, weights and mask as
    the saved file, in a frame wide enough to use."""
    keep = an.causal_mask(3, 3)
    w = attention(rng, (2, 3, 3), keep=keep)
    ex = explore(w, ["x", "<y>", "z"], mask=keep, title="inline")
    rep = ex._repr_html_()
    srcdoc = re.search(r'srcdoc="([^"]*)"', rep).group(1)
    page = html.unescape(srcdoc)
    assert page == ex.html()
    data = page_data(page)
    assert data["qTokens"] == ["x", "<y>", "z"]
    for h in range(2):
        np.testing.assert_allclose(decode_head(data, 0, h), w[h], atol=2e-3)
        assert np.array_equal(decode_mask(data, 0, h), keep)
    assert re.search(r"width:\s*100%", rep) and re.search(r"height:\s*[4-9]\d\dpx", rep)


def test_import_needs_no_matplotlib_or_torch():
    code = ("import sys, numpy as np; from attnkit.viz import explore; "
            "explore(np.eye(3)).html(); "
            "bad = [m for m in ('matplotlib', 'torch') if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout


# -- .npz files ------------------------------------------------------------------------------
def test_save_npz_then_load_npz(rng, tmp_path):
    keep = an.causal_mask(5, 5)
    w = attention(rng, (3, 4, 5, 5), keep=keep)
    ex = explore(w, list("abcde"), mask=keep, kv_heads=1, layers=[0, 2], title="saved")
    path = ex.save_npz(tmp_path / "weights.attn")  # any name: no ".npz" is appended
    assert path.exists() and path.name == "weights.attn"
    back = load_npz(path)
    np.testing.assert_allclose(back.weights, w[[0, 2]], rtol=2**-11)
    assert (back.q_tokens, back.k_tokens) == (tuple("abcde"), tuple("abcde"))
    np.testing.assert_array_equal(back.mask, ex.mask)
    assert (back.kv_heads, back.layer_ids, back.title) == (1, (0, 2), "saved")
    exact = load_npz(ex.save_npz(tmp_path / "w32.npz", dtype=np.float32), precision="float16")
    np.testing.assert_array_equal(exact.weights, ex.weights)
    assert exact.precision == "float16"


def test_load_npz_takes_a_plain_savez(rng, tmp_path):
    w = attention(rng, (2, 2, 3, 3))
    np.savez(tmp_path / "plain.npz", weights=w, tokens=np.array(["x", "y", "z"]))
    ex = load_npz(tmp_path / "plain.npz")
    np.testing.assert_array_equal(ex.weights, w)
    assert ex.q_tokens == ("x", "y", "z") and ex.title == "plain"
    np.savez(tmp_path / "none.npz", attn=w)
    with pytest.raises(ValueError, match="no 'weights' array"):
        load_npz(tmp_path / "none.npz")


# -- `attnkit view` --------------------------------------------------------------------------
def test_view_file_writes_the_page_of_an_npz(rng, tmp_path):
    src = explore(attention(rng, (2, 2, 4, 4)), list("abcd")).save_npz(tmp_path / "my run.npz")
    page = view_file(src, tmp_path / "out")
    assert page == tmp_path / "out" / "my_run.html"
    assert page_data(page.read_text(encoding="utf-8"))["qTokens"] == list("abcd")


def test_view_file_runs_a_model_loader(rng, tmp_path):
    calls = []

    def loader(model: str, text: str):
        calls.append((model, text))
        toks = text.split()
        att = tuple(attention(rng, (1, 2, len(toks), len(toks))) for _ in range(3))
        return att, toks  # as transformers' output_attentions: (B, H, T, T) per layer

    page = view_file("org/tiny-model", tmp_path, text="a b c", model_loader=loader)
    assert calls == [("org/tiny-model", "a b c")]
    data = page_data(page.read_text(encoding="utf-8"))
    assert page.name == "tiny-model.html" and (data["L"], data["H"]) == (3, 2)
    assert data["qTokens"] == ["a", "b", "c"]


@pytest.mark.parametrize("source, text, match", [
    ("missing.npz", None, "no such file"),
    ("some-model", None, "needs --text"),
])
def test_view_file_rejects_bad_sources(tmp_path, source, text, match):
    with pytest.raises(ValueError, match=match):
        view_file(tmp_path / source if source.endswith(".npz") else source, tmp_path,
                  text=text)


def test_view_file_model_without_front_end_says_what_to_do(tmp_path, monkeypatch):
    import attnkit.viz.view as view

    def missing(name):
        raise ImportError(f"No module named {name!r}")

    # As on an install without the transformers extra, whether or not this one has it.
    monkeypatch.setattr(view.importlib, "import_module", missing)
    with pytest.raises(ValueError, match="save_npz"):
        view_file("some-model", tmp_path, text="hello")


def test_view_main_exit_codes(rng, tmp_path, capsys):
    src = explore(attention(rng, (1, 2, 3, 3))).save_npz(tmp_path / "w.npz")
    assert view_main([str(src), "--out", str(tmp_path / "o"), "--precision", "float16"]) == 0
    out = capsys.readouterr().out
    assert "wrote" in out and (tmp_path / "o" / "w.html").exists()
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(SystemExit) as exit_info:
        view_main([str(tmp_path / "junk.npz")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "not a readable .npz" in err[-1] and err[-1].startswith("attnkit view: error:")


def test_explorer_is_a_dataclass_with_checked_fields(rng):
    with pytest.raises(ValueError, match="max_bytes"):
        Explorer(np.ones((1, 1, 2, 2), np.float32), ("a", "b"), ("a", "b"), max_bytes=0)
