"""attnkit.torch.d2l against d2l 1.0.3's own classes, on the examples of d2l's chapters on
multi-head attention and on self-attention and positional encoding.

d2l is installed without its dependencies (``pip install --no-deps d2l==1.0.3``: its
metadata pins old numpy/torch). ``d2l.torch`` imports torchvision, pandas, requests,
IPython, matplotlib_inline and scipy at the top without using them for these classes; the
ones missing here are stood in for by empty modules while it is imported, then removed
from ``sys.modules`` again.
"""

from __future__ import annotations

import importlib
import sys
import types

import pytest
import torch

from attnkit.torch import MultiHeadAttention as AttnkitMHA
from attnkit.torch import d2l as ak

# What d2l/torch.py imports at its top that these tests do not need.
UNUSED_IMPORTS = (
    "torchvision", "torchvision.transforms", "pandas", "requests", "IPython",
    "IPython.display", "matplotlib_inline", "matplotlib_inline.backend_inline", "scipy",
    "scipy.spatial",
)


class _Placeholder(types.ModuleType):
    """A module whose every attribute is another placeholder (``from x import y`` works)."""

    def __getattr__(self, name: str) -> _Placeholder:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")


@pytest.fixture(scope="module")
def d2l():
    try:
        importlib.import_module("d2l")
    except ImportError:
        pytest.skip("d2l is not installed: pip install --no-deps d2l==1.0.3")
    added = []
    for name in UNUSED_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            sys.modules[name] = _Placeholder(name)
            added.append(name)
    try:
        module = importlib.import_module("d2l.torch")
    finally:
        for name in added:
            sys.modules.pop(name, None)
    return module


def _pair(d2l, *args, widths=(100, 100, 100)):
    """d2l's module and attnkit's, each built and run once (which materialises d2l 1.0's
    lazy layers) right after seeding torch alike, so with the same initial weights; eval
    mode (dropout off)."""
    modules = []
    for cls in (d2l.MultiHeadAttention, ak.MultiHeadAttention):
        torch.manual_seed(0)
        m = cls(*args).eval()
        with torch.no_grad():
            m(*(torch.zeros(1, 1, w) for w in widths), None)
        modules.append(m)
    return modules


def _same(theirs, ours, q, k, v, valid_lens):
    with torch.no_grad():
        want = theirs(q, k, v, valid_lens)
        got = ours(q, k, v, valid_lens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.attention.attention_weights,
                               theirs.attention.attention_weights, rtol=1e-5, atol=1e-6)
    return got


def test_the_multi_head_chapter_example_matches_d2l(d2l):
    # d2l 1.0, "Multi-Head Attention": 100 hiddens, 5 heads, valid_lens [3, 2].
    theirs, ours = _pair(d2l, 100, 5, 0.5)
    X, Y = torch.ones((2, 4, 100)), torch.ones((2, 6, 100))
    out = _same(theirs, ours, X, Y, Y, torch.tensor([3, 2]))
    assert out.shape == (2, 4, 100)
    # Same seed, same order of the lazy layers: the same initial weights as d2l's.
    for name, p in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[name], p, rtol=0, atol=0)
    # Ones are a weak test (every key alike): random inputs, both kinds of valid_lens.
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn((2, 4, 100), generator=g), torch.randn((2, 6, 100), generator=g)
    _same(theirs, ours, X, Y, Y, torch.tensor([3, 2]))
    _same(theirs, ours, X, Y, Y, torch.tensor([[1, 2, 3, 4], [6, 5, 4, 3]]))
    _same(theirs, ours, X, Y, Y, None)
    assert ours.attention.attention_weights.shape == (2 * 5, 4, 6)  # d2l's (B * H, Tq, Tk)


def test_the_self_attention_chapter_example_matches_d2l(d2l):
    # d2l 1.0, "Self-Attention and Positional Encoding": attention(X, X, X, valid_lens).
    theirs, ours = _pair(d2l, 100, 5, 0.5)
    X = torch.randn((2, 4, 100), generator=torch.Generator().manual_seed(2))
    out = _same(theirs, ours, X, X, X, torch.tensor([3, 2]))
    assert out.shape == (2, 4, 100)


def test_a_state_dict_of_d2l_loads_in_both_constructor_forms(d2l, tmp_path):
    torch.manual_seed(3)
    theirs = d2l.MultiHeadAttention(24, 4, 0.0, bias=True).eval()
    g = torch.Generator().manual_seed(4)
    q, kv = torch.randn((3, 5, 24), generator=g), torch.randn((3, 7, 24), generator=g)
    lens = torch.tensor([7, 1, 4])
    with torch.no_grad():
        theirs(q, kv, kv, lens)  # materialise d2l's lazy layers
    torch.save(theirs.state_dict(), tmp_path / "mha.pt")
    state = torch.load(tmp_path / "mha.pt")
    assert set(state) == {f"W_{n}.{p}" for n in "qkvo" for p in ("weight", "bias")}
    # d2l 1.0's form (lazy layers, filled by the state dict) and d2l 0.17's (sizes given).
    for ours in (ak.MultiHeadAttention(24, 4, 0.0, bias=True),
                 ak.MultiHeadAttention(24, 24, 24, 24, 4, 0.0, bias=True)):
        ours.load_state_dict(state)
        _same(theirs, ours.eval(), q, kv, kv, lens)


def test_a_fully_masked_row_is_zero_not_uniform(d2l):
    theirs, ours = _pair(d2l, 16, 2, 0.0, widths=(16, 16, 16))
    X = torch.randn((2, 3, 16), generator=torch.Generator().manual_seed(5))
    lens = torch.tensor([0, 3])
    with torch.no_grad():
        theirs(X, X, X, lens)
        ours(X, X, X, lens)
    w_theirs, w_ours = theirs.attention.attention_weights, ours.attention.attention_weights
    # Example 0's heads (rows 0 and 1): d2l spreads them evenly over masked keys.
    torch.testing.assert_close(w_theirs[:2], torch.full((2, 3, 3), 1 / 3))
    assert torch.equal(w_ours[:2], torch.zeros(2, 3, 3))
    torch.testing.assert_close(w_ours[2:], w_theirs[2:], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_hiddens", [32, 60])
def test_positional_encoding_matches_d2l(d2l, num_hiddens):
    theirs = d2l.PositionalEncoding(num_hiddens, 0.0).eval()
    ours = ak.PositionalEncoding(num_hiddens, 0.0).eval()
    torch.testing.assert_close(ours.P, theirs.P, rtol=0, atol=0)
    X = torch.randn((2, 60, num_hiddens), generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(ours(X), theirs(X), rtol=0, atol=0)
    assert ours.state_dict() == theirs.state_dict() == {}  # d2l keeps P out of it too


def test_positional_encoding_takes_odd_widths_and_rejects_long_inputs():
    pe = ak.PositionalEncoding(5, 0.0, max_len=8).eval()
    X = torch.zeros((1, 8, 5))
    P = pe(X)[0]
    pos = torch.arange(8.0)
    torch.testing.assert_close(P[:, 4], torch.sin(pos / 10000 ** (4 / 5)))  # last: a sine
    torch.testing.assert_close(P[:, 1], torch.cos(pos / 10000 ** (0 / 5)))
    with pytest.raises(ValueError, match=r"T <= max_len=8, got \(1, 9, 5\)"):
        pe(torch.zeros((1, 9, 5)))


def test_d2l_arguments_to_attnkits_own_class_name_the_drop_in():
    with pytest.raises(TypeError, match=r"attnkit\.torch\.d2l\.MultiHeadAttention"):
        AttnkitMHA(100, 5, 0.5)
    mha = AttnkitMHA(100, 5)
    X, Y = torch.ones((2, 4, 100)), torch.ones((2, 6, 100))
    with pytest.raises(TypeError, match=r"valid_lens=.*attnkit\.torch\.d2l"):
        mha(X, Y, Y, torch.tensor([3, 2]))
    out, _ = mha(X, Y, Y, valid_lens=torch.tensor([3, 2]))  # the keyword works
    assert out.shape == (2, 4, 100)


def test_bad_d2l_arguments_say_what_fits():
    with pytest.raises(ValueError, match="not a multiple of num_heads=3"):
        ak.MultiHeadAttention(100, 3, 0.5)
    with pytest.raises(TypeError, match=r"d2l 1\.0's \(num_hiddens, num_heads, dropout"):
        ak.MultiHeadAttention(100)
    mha = ak.MultiHeadAttention(8, 2, 0.0)
    with pytest.raises(ValueError, match=r"valid_lens must be \(B,\) or \(B, Tq\) with B=2"):
        mha(torch.ones(2, 3, 8), torch.ones(2, 3, 8), torch.ones(2, 3, 8), torch.tensor([1]))
