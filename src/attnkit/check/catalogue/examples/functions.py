"""Wrong examples and fixes of the codes the function checks find (softmax, attention)."""

from __future__ import annotations

_SOFTMAX = '''import numpy as np
from attnkit.check import check_softmax
'''
_ATTENTION = '''import numpy as np
from attnkit.check import check_attention
'''


def _softmax_body(line: str) -> str:
    return f"\ndef softmax(x):\n{line}"


EXAMPLES: dict[str, tuple[str, str]] = {
    "call-failed": (
        _ATTENTION + '''
def attention(batch):  # one dict of q, k, v: not how attention is called
    q, k, v = batch["q"], batch["k"], batch["v"]
    w = np.exp(q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1]))
    return (w / w.sum(-1, keepdims=True)) @ v

report = check_attention(attention)
assert report.codes == ["call-failed"], report.codes
''',
        _ATTENTION + '''
def attention(q, k, v):  # the inputs as arguments
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v

assert check_attention(attention).ok
'''),
    "nondeterministic": (
        _SOFTMAX + '''
def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    y = e / e.sum(-1, keepdims=True)
    return y * (np.random.rand(*y.shape) > 0.1) / 0.9  # dropout, always on

assert "nondeterministic" in check_softmax(softmax).codes
''',
        _SOFTMAX + '''
def softmax(x):  # dropout belongs to training only: none here
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)

assert check_softmax(softmax).ok
'''),
    "shape": (
        _SOFTMAX + _softmax_body('''    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1)  # (B, T) does not broadcast against (B, T, K)

assert check_softmax(softmax).codes == ["shape"]
'''),
        _SOFTMAX + _softmax_body('''    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)

assert check_softmax(softmax).ok
''')),
    "nan-or-inf": (
        _SOFTMAX + _softmax_body('''    e = np.exp(x)  # exp(1000) overflows
    return e / e.sum(-1, keepdims=True)

assert check_softmax(softmax).codes == ["nan-or-inf"]
'''),
        _SOFTMAX + _softmax_body(
            '''    e = np.exp(x - x.max(-1, keepdims=True))  # at most exp(0) = 1
    return e / e.sum(-1, keepdims=True)

assert check_softmax(softmax).ok
''')),
    "float16-overflow": (
        '''import torch
from attnkit.check import check_attention

def attention(q, k, v, mask):
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    s = s.masked_fill(~mask, -1e9)  # -1e9 does not fit in float16
    return torch.softmax(s, dim=-1) @ v

assert "float16-overflow" in check_attention(attention, convention="keep").codes
''',
        '''import torch
from attnkit.check import check_attention

def attention(q, k, v, mask):
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    s = s.masked_fill(~mask, float("-inf"))
    w = torch.softmax(s.float(), dim=-1).nan_to_num(0.0)  # a row with no key gives 0
    return w.to(v.dtype) @ v

assert check_attention(attention, convention="keep").ok
'''),
    "mask-polarity": (
        _ATTENTION + '''
def attention(q, k, v, keep):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    s = np.where(keep, -np.inf, s)  # hides the keys it should keep
    w = np.exp(s - s.max(-1, keepdims=True))
    return np.nan_to_num(w / w.sum(-1, keepdims=True)) @ v

assert "mask-polarity" in check_attention(attention, convention="keep").codes
''',
        _ATTENTION + '''
def attention(q, k, v, keep):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    s = np.where(keep, s, -np.inf)  # True = may attend
    m = s.max(-1, keepdims=True)
    w = np.exp(s - np.where(np.isfinite(m), m, 0))
    return np.nan_to_num(w / w.sum(-1, keepdims=True)) @ v

assert check_attention(attention, convention="keep").ok
'''),
    "wrong-scale": (
        _ATTENTION + '''
def attention(q, k, v):
    s = q @ k.swapaxes(-1, -2)  # 1/sqrt(Dk) forgotten
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v

assert check_attention(attention).codes == ["wrong-scale"]
''',
        _ATTENTION + '''
def attention(q, k, v):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v

assert check_attention(attention).ok
'''),
    "inaccurate": (
        _ATTENTION + '''
def attention(q, k, v):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-2, keepdims=True))
    return (w / w.sum(-2, keepdims=True)) @ v  # normalised over the queries

assert "inaccurate" in check_attention(attention).codes
''',
        _ATTENTION + '''
def attention(q, k, v):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v  # over the keys

assert check_attention(attention).ok
'''),
    "mutates-input": (
        _SOFTMAX + _softmax_body(
            '''    x -= x.max(-1, keepdims=True)  # writes into the caller's array
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)

assert check_softmax(softmax).codes == ["mutates-input"]
'''),
        _SOFTMAX + _softmax_body('''    x = x - x.max(-1, keepdims=True)  # a new array
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)

assert check_softmax(softmax).ok
''')),
    "gradient": (
        '''import torch
from attnkit.check import check_softmax

class Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.softmax(x, dim=-1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return y * g  # the sum term of softmax's Jacobian is missing

assert check_softmax(Softmax.apply).codes == ["gradient"]
''',
        '''import torch
from attnkit.check import check_softmax

class Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.softmax(x, dim=-1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return y * (g - (g * y).sum(-1, keepdim=True))

assert check_softmax(Softmax.apply).ok
'''),
    "causal-leak": (
        _ATTENTION + '''
def attention(q, k, v):  # meant to be causal, but masks nothing
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v

assert "causal-leak" in check_attention(attention, causal=True).codes
''',
        _ATTENTION + '''
def attention(q, k, v):
    Tq, Tk = q.shape[-2], k.shape[-2]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    s = np.where(np.tri(Tq, Tk, Tk - Tq, dtype=bool), s, -np.inf)  # keys j <= i + Tk - Tq
    m = s.max(-1, keepdims=True)
    w = np.exp(s - np.where(np.isfinite(m), m, 0))  # a query before every key: all zeros
    return np.nan_to_num(w / w.sum(-1, keepdims=True)) @ v

assert check_attention(attention, causal=True).ok
'''),
    "fully-masked-row": (
        '''import numpy as np
from attnkit.check import check_masked_softmax

def masked_softmax(x, valid_lens):
    keep = np.arange(x.shape[-1]) < valid_lens[:, None, None]
    x = np.where(keep, x, np.finfo(x.dtype).min)  # a row with no key becomes uniform
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)

report = check_masked_softmax(masked_softmax)
assert report.codes == ["fully-masked-row"] and report.ok  # a warning: a convention
''',
        '''import numpy as np
from attnkit.check import check_masked_softmax

def masked_softmax(x, valid_lens):
    keep = np.arange(x.shape[-1]) < valid_lens[:, None, None]
    x = np.where(keep, x, -np.inf)
    m = x.max(-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0))  # a row with no key: all zeros
    s = e.sum(-1, keepdims=True)
    return e / np.where(s > 0, s, 1)

assert check_masked_softmax(masked_softmax).codes == []
'''),
    "causal-alignment": (
        _ATTENTION + '''
def attention(q, k, v, attn_mask=None, is_causal=False):
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if is_causal:  # top-left: query i sees keys j <= i
        s = np.where(np.tri(q.shape[-2], k.shape[-2], dtype=bool), s, -np.inf)
    if attn_mask is not None:
        s = np.where(attn_mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    w = np.exp(s - np.where(np.isfinite(m), m, 0))
    return np.nan_to_num(w / w.sum(-1, keepdims=True)) @ v

assert "causal-alignment" in check_attention(attention, convention="sdpa").codes
''',
        _ATTENTION + '''
def attention(q, k, v, attn_mask=None, is_causal=False):
    Tq, Tk = q.shape[-2], k.shape[-2]
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if is_causal:  # bottom-right: query i sees keys j <= i + Tk - Tq
        s = np.where(np.tri(Tq, Tk, Tk - Tq, dtype=bool), s, -np.inf)
    if attn_mask is not None:
        s = np.where(attn_mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    w = np.exp(s - np.where(np.isfinite(m), m, 0))
    return np.nan_to_num(w / w.sum(-1, keepdims=True)) @ v

assert "causal-alignment" not in check_attention(attention, convention="sdpa").codes
'''),
    "one-sequence": (
        _ATTENTION + '''
def attention(q, k, v):  # written for one (T, D) sequence: k.T reverses every axis
    s = q @ k.T / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v

report = check_attention(attention)
assert report.codes == ["one-sequence"] and report.ok  # a warning: a layout
''',
        _ATTENTION + '''
def attention(q, k, v):  # any batch: only the last two axes swapped
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v

assert check_attention(attention).codes == []
'''),
}
