"""attnkit.torch against the plain PyTorch call it wraps, in one process (issue 11's table).

Each row times attnkit and its peer on the same inputs, interleaved: per round, ``n``
calls of one then ``n`` of the other (the order alternating between rounds), and the
reported ratio is the median of the per-round ratios, so that load on a shared machine
hits both alike. Peers:

- SDPA: ``torch.nn.functional.scaled_dot_product_attention`` with the same mask (a bool
  key mask for padding; nothing for one query under causal, which sees every key;
  ``is_causal`` for a causal prefill).
- eager: ``softmax((q * scale) @ k^T [+ padding bias]) @ v``, returning the weights.
- an SDPA decoding step: the four projections, a write into preallocated cache buffers,
  SDPA over the filled part with the mask, the output projection.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch
from torch.nn import functional as F

import attnkit.torch as at

# The clock of the ratios: wall time by default; ``torch_cpu.py --cpu-clock`` sets the
# thread's CPU time, which time spent waiting for a core on a shared machine does not
# inflate (with --threads 1 the thread does all of the work).
CLOCK: Callable[[], float] = time.perf_counter


def ratio(ours: Callable[[], object], peer: Callable[[], object], n: int,
          rounds: int) -> tuple[float, float, float]:
    """``(median ours/peer per round, peer seconds, ours seconds)`` (medians per call)."""
    for _ in range(2):
        ours(), peer()
    ratios, t_ours, t_peer = [], [], []
    for r in range(rounds):
        order = ((peer, t_peer), (ours, t_ours)) if r % 2 == 0 else ((ours, t_ours),
                                                                      (peer, t_peer))
        took = {}
        for fn, times in order:
            t0 = CLOCK()
            for _ in range(n):
                fn()
            took[id(times)] = (CLOCK() - t0) / n
            times.append(took[id(times)])
        ratios.append(took[id(t_ours)] / took[id(t_peer)])
    return statistics.median(ratios), statistics.median(t_peer), statistics.median(t_ours)


def _padding(B: int, T: int, short: int) -> tuple[torch.Tensor, torch.Tensor]:
    """valid_lens (B,) with the first row ``short`` keys short, and the same as a bool
    key mask (B, 1, 1, T)."""
    vl = torch.full((B,), T)
    vl[0] = T - short
    return vl, (torch.arange(T) < vl[:, None])[:, None, None, :]


def functional_rows(quick: bool) -> list[list[object]]:
    """Prefill, decoding and need_weights rows: ``[case, peer, peer ms, ours ms, ratio]``."""
    g = torch.Generator().manual_seed(0)
    rows: list[list[object]] = []

    def add(case: str, peer_name: str, ours, peer, n: int, rounds: int) -> None:
        r, tp, to = ratio(ours, peer, n, rounds)
        rows.append([case, peer_name, f"{tp * 1e3:.3f}", f"{to * 1e3:.3f}", round(r, 3)])

    B, H, D = 2, 8, 64
    T = 256 if quick else 1024
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    vl, key_mask = _padding(B, T, T // 10)
    rounds = 5 if quick else 11
    add(f"prefill T={T}, no mask", "SDPA", lambda: at.attention(q, k, v),
        lambda: F.scaled_dot_product_attention(q, k, v), 1, rounds)
    add(f"prefill T={T}, causal", "SDPA", lambda: at.attention(q, k, v, causal=True),
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 1, rounds)
    add(f"prefill T={T}, padding", "SDPA", lambda: at.attention(q, k, v, valid_lens=vl),
        lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask), 1, rounds)

    for Tk in ((160,) if quick else (160, 4096)):
        rows += _decode_rows(Tk, g)
    B, T = 2, (128 if quick else 512)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    vl, key_mask = _padding(B, T, T // 10)
    for case, kw, bias in (("no mask", {}, None),
                           ("padding", {"valid_lens": vl}, pad_bias(key_mask))):
        add(f"need_weights B={B} H={H} T={T}, {case}", "eager",
            lambda kw=kw: at.attention(q, k, v, need_weights=True, **kw),
            lambda bias=bias: eager_weights(q, k, v, bias), 1, rounds)
    return rows


def _decode_rows(Tk: int, g: torch.Generator) -> list[list[object]]:
    """One query (B=4, H=8, D=64) over Tk keys: causal, padding given as valid_lens (the
    mask built and the lengths checked per call) and as the same key mask SDPA gets."""
    B, H, D = 4, 8, 64
    q = torch.randn(B, H, 1, D, generator=g)
    k, v = (torch.randn(B, H, Tk, D, generator=g) for _ in range(2))
    vl, key_mask = _padding(B, Tk, 10)
    n = 20 if Tk <= 512 else 2
    rows = []
    for case, ours, peer in (
        ("causal", lambda: at.attention(q, k, v, causal=True),
         lambda: F.scaled_dot_product_attention(q, k, v)),
        ("padding", lambda: at.attention(q, k, v, valid_lens=vl),
         lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)),
        ("padding (mask)", lambda: at.attention(q, k, v, mask=key_mask),
         lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)),
    ):
        r, tp, to = ratio(ours, peer, n, 31)
        rows.append([f"decode Tq=1 Tk={Tk}, {case}", "SDPA", f"{tp * 1e3:.3f}",
                     f"{to * 1e3:.3f}", round(r, 3)])
    return rows


def pad_bias(key_mask: torch.Tensor) -> torch.Tensor:
    """A bool key mask as the additive float bias eager code adds (0 / -inf)."""
    return torch.zeros(key_mask.shape).masked_fill(~key_mask, float("-inf"))


def eager_weights(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook: ``w = softmax((q * scale) @ k^T [+ bias])``, ``(w @ v, w)``."""
    s = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-1, -2)
    if bias is not None:
        s = s + bias
    w = torch.softmax(s, dim=-1)
    return w @ v, w


class SdpaStep(torch.nn.Module):
    """The peer of a MultiHeadAttention decoding step: the same projections (shared
    weights), the new key/value written into preallocated buffers, SDPA with the mask."""

    def __init__(self, m: at.MultiHeadAttention, B: int, capacity: int) -> None:
        super().__init__()
        self.m = m
        H, Dk = m.num_heads, m.head_dim
        self.k = torch.zeros(B, H, capacity, Dk)
        self.v = torch.zeros(B, H, capacity, Dk)
        self.length = 0

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
        m, (B, T, _) = self.m, x.shape
        H, D = m.num_heads, m.head_dim
        q = m.q_proj(x).view(B, T, H, D).transpose(1, 2)
        new = slice(self.length, self.length + T)
        self.k[:, :, new] = m.k_proj(x).view(B, T, H, D).transpose(1, 2)
        self.v[:, :, new] = m.v_proj(x).view(B, T, H, D).transpose(1, 2)
        self.length += T
        L = self.length
        mask = None if key_mask is None else key_mask[..., :L]
        out = F.scaled_dot_product_attention(q, self.k[:, :, :L], self.v[:, :, :L],
                                             attn_mask=mask)
        return m.out_proj(out.transpose(1, 2).reshape(B, T, H * D))


def mha_decode_rows(quick: bool) -> list[list[object]]:
    """One MultiHeadAttention decoding step through a KVCache (Tk cached positions) vs
    :class:`SdpaStep`: ``[case, peer, peer ms, ours ms, ratio]``."""
    torch.manual_seed(0)
    B, E, H = 4, 512, 8
    m = at.MultiHeadAttention(E, H).eval()
    rows: list[list[object]] = []
    for Tk in ((160,) if quick else (160, 4096)):
        rows += _mha_step_rows(m, B, Tk)
    return rows


def _mha_step_rows(m: at.MultiHeadAttention, B: int, Tk: int) -> list[list[object]]:
    """Causal; padding kept by the cache (a left-padded prompt: the first 10 positions of
    row 0, given once with the prompt); padding given per step as valid_lens."""
    x = torch.randn(B, 1, m.embed_dim)
    cache, padded = m.init_cache(B, Tk), m.init_cache(B, Tk)
    real = torch.ones(B, Tk, dtype=torch.bool)
    real[0, :10] = False  # left padding
    with torch.no_grad():
        m(torch.randn(B, Tk - 1, m.embed_dim), causal=True, cache=padded,
          padding_mask=real[:, :Tk - 1])
    peer = SdpaStep(m, B, Tk)
    vl, key_mask = _padding(B, Tk, 10)
    rows: list[list[object]] = []
    for case, kw, pmask, c in (("causal", {"causal": True}, None, cache),
                               ("padding (kept by the cache)", {}, real[:, None, None, :],
                                padded),
                               ("padding (valid_lens)", {"valid_lens": vl}, key_mask, cache)):
        def ours(kw: dict = kw, c: at.KVCache = c) -> None:
            c.length = Tk - 1  # the prefix stays cached; one new position
            m(x, cache=c, **kw)

        def sdpa(pmask: torch.Tensor | None = pmask) -> None:
            peer.length = Tk - 1
            peer(x, pmask)

        with torch.no_grad():
            r, tp, to = ratio(ours, sdpa, 20 if Tk <= 512 else 2, 31)
        rows.append([f"MHA decode step Tk={Tk} E={m.embed_dim} H={m.num_heads} B={B}, {case}",
                     "SDPA step", f"{tp * 1e3:.3f}", f"{to * 1e3:.3f}", round(r, 3)])
    return rows
