"""Reading a multi-head module's structure from one forward with hooks, so that the float64
oracle can be computed from the module's own weights (:mod:`attnkit.check.multihead.oracle`).

One call of the module, with a forward hook on every submodule, records what each
``nn.Linear`` read and wrote, any ``nn.MultiheadAttention`` (or attnkit's
``MultiHeadAttention``) inside with the arguments it got, and every other submodule that ran
(a norm, a rotary embedding: what the check cannot read). From those calls the data flow
names the parts: the projections are the ``nn.Linear`` layers that read the module's input
(the query input for ``q``, the key/value input for ``k`` and ``v``), the output projection
is the one whose output is the module's output, and its input is the attention core's
merged result. Which projection is ``q``, ``k`` or ``v``, and how a fused projection's
columns split into them, is not read off names: :func:`candidates` lists every reading the
data flow allows (any q/k/v order; ``(3, H, d)`` chunks or a per-head ``(H, 3, d)``
interleave; ``(H, d)`` or ``(d, H)`` columns per head), and the oracle keeps the one that
fits.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from .oracle_words import say

if TYPE_CHECKING:
    from ..core.report import Finding

__all__ = ["Candidate", "Capture", "Inner", "Outcome", "capture", "candidates", "heads_of"]

HEAD_ATTRS = ("num_heads", "n_heads", "n_head", "nhead", "nheads", "num_head", "heads", "h",
              "H", "num_attention_heads", "head_num", "head_count", "n_h", "nh")
# Submodules that leave the data flow as the check reads it.
TRANSPARENT = (nn.Dropout, nn.Identity, nn.Softmax, nn.Sequential, nn.ModuleList,
               nn.ModuleDict)


@dataclass
class Call:
    """One submodule call: its dotted name, the module, inputs and output (detached)."""

    name: str
    module: nn.Module
    args: tuple
    kwargs: dict
    out: Any


@dataclass
class Inner:
    """An ``nn.MultiheadAttention`` or attnkit ``MultiHeadAttention`` inside (or as) the
    checked module, and the one call it got."""

    call: Call
    kind: str  # "torch" or "attnkit"


@dataclass
class Capture:
    """What one forward showed.

    Attributes:
        xq, xkv: the query and key inputs, batch-first ``(B, T, E)``.
        xv: the value input (a tensor of its own for ``m(query, key, value)``, so that what
            each projection reads shows; ``xkv`` where the check passed one for both).
        out: the module's output, batch-first ``(B, Tq, E)``.
        linears: every ``nn.Linear`` call outside an inner attention module, in order.
        inner: the outermost inner attention module's call, or None.
        others: the names and classes of the other submodules that ran.
    """

    xq: torch.Tensor
    xkv: torch.Tensor
    out: torch.Tensor
    linears: list[Call] = field(default_factory=list)
    inner: Inner | None = None
    others: list[tuple[str, str, Call]] = field(default_factory=list)
    xv: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.xv is None:
            self.xv = self.xkv


def _inner_kind(m: nn.Module) -> str | None:
    if isinstance(m, nn.MultiheadAttention):
        return "torch"
    from ...torch import MultiHeadAttention

    return "attnkit" if isinstance(m, MultiHeadAttention) else None


def _detach(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_detach(v) for v in x)
    return x


def capture(h: Any, m: nn.Module, xq: torch.Tensor, xkv: torch.Tensor,
            xv: torch.Tensor | None = None) -> Capture:
    """Run ``m`` once through the harness ``h`` (as the check calls it) with hooks.

    Args:
        h: the :class:`~attnkit.check.multihead.probe.Harness`.
        m: the module (eval mode, dropout off).
        xq, xkv: batch-first inputs ``(B, Tq, E)``, ``(B, Tk, E)`` (the same tensor for a
            self-attention module).
        xv: the value input ``(B, Tk, E)`` of ``m(query, key, value)``, else ``xkv``.

    Returns:
        A :class:`Capture`.
    """
    calls: list[Call] = []
    handles = []

    def hook(name: str):
        def record(mod: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            calls.append(Call(name, mod, _detach(args), _detach(kwargs), _detach(out)))
        return record

    for name, sub in m.named_modules():
        handles.append(sub.register_forward_hook(hook(name), with_kwargs=True))
    try:
        with torch.no_grad():
            out = h.call(m, xq, None if h.self_only else xkv, xv=xv)
    finally:
        for handle in handles:
            handle.remove()
    cap = Capture(xq, xkv, out.detach(), xv=xv)
    inner_names = [c.name for c in calls if _inner_kind(c.module)]
    outer = min(inner_names, key=len) if inner_names else None
    for c in calls:
        inside = outer is not None and (c.name == outer or c.name.startswith(outer + ".")
                                        or outer == "")
        if c.name == outer:
            kind = _inner_kind(c.module)
            assert kind is not None
            cap.inner = Inner(c, kind)
        elif inside or c.name == "":
            continue
        elif isinstance(c.module, nn.Linear):
            cap.linears.append(c)
        elif not isinstance(c.module, TRANSPARENT):
            cap.others.append((c.name, type(c.module).__name__, c))
    return cap


def batch_first(t: Any, Bn: int, T: int) -> torch.Tensor | None:
    """``t`` as ``(B, T, n)``: as it is, from ``(T, B, n)`` or from ``(B*T, n)``; None when
    its shape is none of those."""
    if not isinstance(t, torch.Tensor) or t.dim() not in (2, 3):
        return None
    if t.dim() == 2:
        return t.reshape(Bn, T, -1) if t.shape[0] == Bn * T else None
    if tuple(t.shape[:2]) == (Bn, T):
        return t
    if tuple(t.shape[:2]) == (T, Bn):
        return t.transpose(0, 1)
    return None


def same(t: Any, x: torch.Tensor) -> bool:
    """``t`` holds exactly ``x`` (batch-first ``(B, T, n)``), in any layout
    :func:`batch_first` reads."""
    y = batch_first(t, x.shape[0], x.shape[1])
    return y is not None and y.shape == x.shape and torch.equal(y, x)


def heads_of(m: nn.Module, width: int, default: int) -> tuple[int, bool]:
    """``(H, read)``: the head count from the module's attributes (``num_heads``,
    ``n_head``...; ``read`` True), else ``default``."""
    for mod in m.modules():
        for attr in HEAD_ATTRS:
            value = getattr(mod, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
                    and width % value == 0:
                return value, True
    return default, False


@dataclass
class Candidate:
    """One reading of how the projections' outputs become q, k, v heads.

    Attributes:
        label: in words, for the report (``"separate q/k/v nn.Linear"``).
        parts: for each of q, k, v: ``(index into Capture.linears, first column, width)``.
        H, Hkv, d, dv: heads and head dims.
        layout: ``"hd"`` (columns ``h * d + c``) or ``"dh"`` (``c * H + h``).
        interleave: a fused projection whose columns run ``(H, 3, d)``: the q/k/v parts
            are per-head slices (then ``parts`` hold the order as first columns 0, d, 2d).
        cycle: with fewer key/value heads, query head ``h`` reads key/value head
            ``h % Hkv`` (``k.repeat(1, G, 1, 1)``) instead of ``h // G``
            (``repeat_interleave``): the same modules with the query heads in another order.
    """

    label: str
    parts: tuple[tuple[int, int, int], ...]
    H: int
    Hkv: int
    d: int
    dv: int
    layout: str = "hd"
    interleave: bool = False
    cycle: bool = False

    def _order(self) -> np.ndarray:
        """The query heads in the order in which head ``p`` reads key/value head
        ``p // G`` (the oracle's grouping)."""
        h = np.arange(self.H)
        return np.argsort((h % self.Hkv) * (self.H // self.Hkv) + h // self.Hkv) \
            if self.cycle else h

    def split(self, P: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q ``(B, H, Tq, d)``, k ``(B, Hkv, Tk, d)``, v ``(B, Hkv, Tk, dv)`` from the
        projections' outputs ``P[i]`` ``(B, T, n)``."""
        out = []
        for (i, first, width), n, dim in zip(self.parts, (self.H, self.Hkv, self.Hkv),
                                             (self.d, self.d, self.dv)):
            p = P[i]
            Bn, T = p.shape[:2]
            if self.interleave:
                x = p.reshape(Bn, T, n, 3, dim)[:, :, :, first // dim]
                out.append(x.transpose(0, 2, 1, 3))
                continue
            x = p[:, :, first:first + width]
            if self.layout == "hd":
                out.append(x.reshape(Bn, T, n, dim).transpose(0, 2, 1, 3))
            else:
                out.append(x.reshape(Bn, T, dim, n).transpose(0, 3, 1, 2))
        return out[0][:, self._order()], out[1], out[2]

    def merge(self, o: np.ndarray) -> np.ndarray:
        """``(B, H, Tq, dv)`` -> ``(B, Tq, H * dv)`` in this reading's column layout."""
        Bn, H, T, dv = o.shape
        o = o[:, np.argsort(self._order())] if self.cycle else o
        if self.layout == "hd":
            return o.transpose(0, 2, 1, 3).reshape(Bn, T, H * dv)
        return o.transpose(0, 2, 3, 1).reshape(Bn, T, dv * H)


def _widths(nq: int, nk: int, nv: int, H: int) -> tuple[int, int, int, int] | None:
    """``(H, Hkv, d, dv)`` for projections ``nq, nk, nv`` wide; None when they do not
    split into heads (``H % Hkv == 0``, k and v with the same head count)."""
    if nq % H:
        return None
    d = nq // H
    if nk % d:
        return None
    Hkv = nk // d
    if Hkv == 0 or H % Hkv or nv % Hkv:
        return None
    return H, Hkv, d, nv // Hkv


def candidates(cap: Capture, self_only: bool, H: int) -> tuple[list[Candidate], str]:
    """Every reading of the projections the data flow allows, most usual first, and ``""``;
    or ``([], why)`` when the structure cannot be read."""
    lin = cap.linears
    on_q = [i for i, c in enumerate(lin) if c.args and same(c.args[0], cap.xq)]
    # m(query, key, value): the projections of the key and of the value input, in any
    # order; which reads which is judged once a reading fits (roles.misread_inputs)
    on_kv = on_q if self_only else [i for i, c in enumerate(lin) if c.args and (
        same(c.args[0], cap.xkv) or same(c.args[0], cap.xv))]
    if not lin:
        return [], say("oracle.why-no-linear")
    if not on_q:
        return [], say("oracle.why-input-changed")
    width = {i: int(lin[i].module.out_features) for i in set(on_q) | set(on_kv)}
    found: list[Candidate] = []
    if self_only and len(on_q) == 3 or not self_only and len(on_q) == 1 and len(on_kv) == 2:
        triples = (itertools.permutations(on_q) if self_only else
                   [(on_q[0], a, b) for a, b in itertools.permutations(on_kv)])
        for (iq, ik, iv), layout in itertools.product(list(triples), ("hd", "dh")):
            w = _widths(width[iq], width[ik], width[iv], H)
            if w is None:
                continue
            label = say("oracle.label-separate" if layout == "hd" else "oracle.label-separate-dh")
            found.append(Candidate(label, ((iq, 0, width[iq]), (ik, 0, width[ik]),
                                           (iv, 0, width[iv])), *w, layout=layout))
    elif self_only and len(on_q) == 1:
        i = on_q[0]
        n = width[i]
        names = "qkv"
        for order in itertools.permutations(range(3)):
            word = "".join(names[j] for j in order)
            # (3, H, d) chunks: q, k, v widths from the GQA rule with nk == nv.
            for Hkv in [h for h in range(H, 0, -1) if H % h == 0]:
                if n % (H + 2 * Hkv):
                    continue
                d = n // (H + 2 * Hkv)
                sizes = {0: H * d, 1: Hkv * d, 2: Hkv * d}
                first, cols = 0, {}
                for j in order:
                    cols[j] = (i, first, sizes[j])
                    first += sizes[j]
                found.append(Candidate(say("oracle.label-fused", order=word),
                                       (cols[0], cols[1], cols[2]), H, Hkv, d, d))
            if n % (3 * H) == 0:
                d = n // (3 * H)
                parts = tuple((i, order.index(j) * d, d) for j in range(3))
                found.append(Candidate(say("oracle.label-interleaved", order=word),
                                       parts, H, H, d, d, interleave=True))
    elif (not self_only and len(on_q) == 1 and len(on_kv) == 1
          or self_only and len(on_q) == 2):
        pairs = ([(on_q[0], on_kv[0])] if not self_only else
                 [(on_q[0], on_q[1]), (on_q[1], on_q[0])])
        for (iq, ikv), order in itertools.product(pairs, ("kv", "vk")):
            nq, nkv = width[iq], width[ikv]
            if nkv % 2 == 0:
                w = _widths(nq, nkv // 2, nkv // 2, H)
                if w is None:
                    continue
                k0, v0 = (0, nkv // 2) if order == "kv" else (nkv // 2, 0)
                half = nkv // 2
                found.append(Candidate(say("oracle.label-q-fused-kv", order=order),
                                       ((iq, 0, nq), (ikv, k0, half), (ikv, v0, half)), *w))
    if not found:
        return [], say("oracle.why-layout", nq=len(on_q), nkv=len(on_kv),
                       widths=sorted(width.values()))
    # GQA written with repeat (head h reads h % Hkv) rather than repeat_interleave.
    found += [dataclasses.replace(c, cycle=True, label=say("oracle.label-cycle", label=c.label))
              for c in found if c.Hkv < c.H]
    return found, ""


def output_projection(cap: Capture) -> tuple[nn.Linear | None, torch.Tensor | None, bool]:
    """The output projection and its input batch-first (the merged heads), and whether its
    output is the module's output: the ``nn.Linear`` that gives the module's output, else
    the last one that reads neither input (something runs after it: a residual);
    ``(None, None, False)`` when there is none."""
    Bn, T = cap.out.shape[:2]
    for c in reversed(cap.linears):
        if c.args and same(c.out, cap.out):
            merged = batch_first(c.args[0], Bn, T)
            if merged is not None:
                return c.module, merged, True
    for c in reversed(cap.linears):
        if c.args and not any(same(c.args[0], x) for x in (cap.xq, cap.xkv, cap.xv)):
            merged = batch_first(c.args[0], Bn, T)
            if merged is not None:
                return c.module, merged, False
    return None, None, False


@dataclass
class Outcome:
    """What the oracle comparison found: ``compared`` False with ``why`` when it could not
    compare; ``structure`` in words; ``finding`` when the module disagrees."""

    compared: bool
    why: str = ""
    structure: str = ""
    finding: Finding | None = None
    cand: Candidate | None = None  # the reading of the structure the finding is made on
    causal: bool = False  # ... and whether it was judged causal

    def as_dict(self) -> dict:
        d: dict[str, Any] = {"compared": self.compared, "why": self.why}
        if self.structure:
            d["structure"] = self.structure
        return d
