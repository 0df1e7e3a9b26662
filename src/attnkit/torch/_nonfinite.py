"""NaN in a masked position must not leak: the one place that keeps it out, branch-free.

A masked weight is exactly 0, but ``0 * nan = nan``: a NaN or inf in a key/value row that
a query may not attend would still reach that query's output through the ``w @ v``
matmul, and every gradient through the backward's matmuls (``dQ = dS K``, ``dK = dS^T Q``,
``dW = dY^T X`` of a projection). NaN in an *attended* position must propagate.

Nothing here reads a tensor back to Python: every step runs whatever the data holds, as
tensor ops whose cost is fixed by the shapes. What it costs (passes over q, k, v of
``O(T * D)``, never ``O(Tq * Tk * D)``), by the structure of the mask
(:class:`attnkit.torch._keep.Keep`):

- **key masks** (padding, 1-D ``valid_lens``; also one query, as in decoding): a key row no
  query may attend is zeroed (:func:`zero_rows`), and so is a query row with no key.
  Exact: the rows that stay are attended, so their NaN propagates through the kernel.
- **band / per-query lengths** (causal, window, 2-D ``valid_lens``): a key row can be
  attended by some queries and masked for others, so the kernel gets k and v with every
  non-finite entry zeroed, and :func:`restore` adds back, per query, what its attended
  entries hold: their IEEE sum (NaN, or +-inf when all of one sign), per feature for values
  and as a whole-row NaN for keys (a NaN or inf key spoils its score). Prefix sums over the
  keys compute it; a window with a left edge counts by kind instead
  (:mod:`attnkit.torch._ieee_sums`).
- **dense masks** (any other pattern): as the band, but per query row: a query that may
  attend a non-finite value gets it in every feature (one small ``(Tq, Tk) @ (Tk, 1)``
  product per head finds which).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ._ieee_sums import bad_part, band_sum, dense_sum
from ._keep import Keep

__all__ = [
    "Guarded",
    "LaterFix",
    "all_finite",
    "bitmask",
    "finite_safe",
    "guard_inputs",
    "restore",
    "restore_weights",
    "used_keys",
    "zero_masked_keys",
    "zero_rows",
    "zero_rows_",
]

_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16,
         torch.float32: torch.int32, torch.float64: torch.int64}


def bitmask(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``keep`` as all-ones (True) / all-zeros (False) integers as wide as ``dtype``."""
    return keep.to(_BITS[dtype]).neg_()


class _ZeroRows(torch.autograd.Function):
    """``x`` where ``keep``, else +0.0, as a bitwise AND of the float's bits.

    A select that NaN cannot pass through (``x * 0`` is NaN for NaN ``x``), and the one
    that runs at the speed of a multiply on the CPU (``torch.where`` with a bool mask is
    3-4x slower there). +0.0 is the all-zero bit pattern, so AND-ing with 0 gives +0.0
    whatever ``x`` held; AND-ing with all ones gives ``x`` bit for bit.
    """

    @staticmethod
    def forward(ctx: object, x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(bits)  # type: ignore[attr-defined]
        return x.view(bits.dtype).bitwise_and(bits).view(x.dtype)

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (bits,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return _ZeroRows.apply(g, bits), None


def zero_rows(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``x`` with the entries where ``keep`` (bool, broadcastable) is False set to +0.0 —
    NaN and inf included — in a new tensor, and the same for its gradient."""
    return _ZeroRows.apply(x, bitmask(keep, x.dtype))


def zero_rows_(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """:func:`zero_rows` in place, for a buffer of the caller's own outside autograd."""
    x.view(_BITS[x.dtype]).bitwise_and_(bitmask(keep, x.dtype))
    return x


def all_finite(*xs: torch.Tensor) -> bool:
    """True when every entry of every tensor is finite: one reduction each and one host
    sync in all (a finite sum implies finite entries; a sum that overflows merely sends the
    caller down its slower, still exact, path).

    Only :mod:`attnkit.torch.lse` (ring attention's blocks) uses it, to choose a path per
    masked block; :func:`attnkit.torch.attention` and the modules never read a tensor back.
    """
    total = sum(torch.sum(x, dtype=torch.float32 if x.dtype in (torch.float16, torch.bfloat16)
                          else None) for x in xs)
    return bool(torch.isfinite(torch.as_tensor(total)))


def zero_masked_keys(x: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """Keys or values ``x (B, Hkv, Tk, D)`` with the positions a key mask ``(B, Tk)`` (True =
    may attend) excludes zeroed, whatever they hold; a new tensor."""
    if key_mask is None:
        return x
    return zero_rows(x, key_mask[:, None, :, None])


# -- which rows the kernel may see -------------------------------------------------------


def _fold(m: torch.Tensor, G: int, like: tuple[int, ...]) -> torch.Tensor:
    """A bool ``m (..., H|1, Tk)`` over query heads as ``(..., Hkv|1, Tk)``: True where any
    of a group's ``G`` heads is True; leading axes reduced where ``like`` (k's shape
    without its last axis) has size 1 or none, so that the result broadcasts onto k."""
    if G > 1 and m.ndim >= 2 and m.shape[-2] > 1:
        m = m.unflatten(-2, (m.shape[-2] // G, G)).any(dim=-2)
    while m.ndim > len(like):
        m = m.any(dim=0)
    for i, (n, target) in enumerate(zip(m.shape, like[len(like) - m.ndim:])):
        if target == 1 and n != 1:
            m = m.any(dim=i, keepdim=True)
    return m


def used_keys(keep: Keep, k: torch.Tensor, G: int) -> torch.Tensor | None:
    """``(..., Hkv, Tk, 1)``: keys some query may attend; None when every key is."""
    left, right = keep.band if keep.band is not None else (None, None)
    if keep.only_band and left is None and (right is None or right >= 0):
        return None  # a band open to the left: the last query reaches every key
    used = keep.full()
    used = used.any(dim=-2) if used.shape[-2] > 1 else used.squeeze(-2)  # (..., H|1, Tk)
    return _fold(used, G, tuple(k.shape[:-1]))[..., None]


# -- the guard -----------------------------------------------------------------------------


class Guarded(NamedTuple):
    """Inputs the kernel may multiply by a masked 0 freely, and what to add back.

    ``out_fix`` goes onto the output and ``weight_fix`` onto the weights (by
    :func:`restore`): ``(..., H, Tq, Dv|1)``, or ``(..., Hkv, G|1, Tq, Dv|1)`` with GQA;
    None when nothing needs adding back.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out_fix: torch.Tensor | LaterFix | None
    weight_fix: torch.Tensor | None


class LaterFix(NamedTuple):
    """An ``out_fix`` under a band, formed once the kernel has read the cleaned inputs
    (without autograd): what the values (and keys, when given) held beyond their cleaned
    copies goes into those copies' own buffers, so the guard allocates one tensor per
    input, not two (on the CPU each is a fresh mmap, page faults included)."""

    v: torch.Tensor  # the caller's values
    clean: torch.Tensor  # the guard's cleaned copy, free once the kernel has read it
    keep: Keep
    G: int
    k: torch.Tensor | None = None  # the caller's keys, when their copy is free too
    clean_k: torch.Tensor | None = None
    k_fix: torch.Tensor | None = None  # a keys' fix formed before the kernel

    def value(self) -> torch.Tensor:
        bad = _leftover(self.v, self.clean)  # (..., Hkv, Tk, Dv): 0, NaN or +-inf
        if self.k is not None and self.clean_k is not None:  # NaN: a key with NaN/inf
            # Folded into the values' leftover before the one prefix sum: a NaN added to
            # a key's row is summed over the same band (and IEEE sums of 0/NaN/+-inf
            # come out the same either way), with one pass over V's size fewer.
            bad = bad.add_(_leftover(self.k, self.clean_k).sum(-1, keepdim=True).mul_(0.0))
        fix = band_sum(bad, self.keep, self.G)
        return fix if self.k_fix is None else fix + self.k_fix


def _leftover(x: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """``x - clean`` (0, NaN or +-inf per entry), in ``clean``'s buffer when not tracing."""
    if torch.compiler.is_compiling():
        return x - clean
    return torch.sub(x, clean, out=clean)


def guard_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: Keep | None, G: int,
    *, keys_by_select: bool = False, rows_zeroed: bool = False, grad: bool | None = None,
    codes: torch.Tensor | None = None, weights: bool = True,
) -> Guarded:
    """q, k, v for a dot-product attention under ``keep`` (group size ``G``), with every
    entry that a masked position could read zeroed, and the fix-ups that put back what
    attended non-finite entries contribute (see the module docstring).

    ``keys_by_select``: the caller masks its scores with a select (``masked_fill``), so a
    NaN in a masked key cannot reach the forward; keys are then cleaned only when a
    gradient could carry it (``dQ = dS K``). ``rows_zeroed``: the caller zeroes the
    weights of a row with no key after its softmax, so a NaN query there cannot reach the
    forward; it is then cleaned only for the gradient (``dK = dS^T Q``). ``grad``: by
    default, whether autograd records q, k or v.

    ``codes``: k and v hold no NaN/inf (a KV cache's buffers) and ``codes (..., Hkv, 2,
    Tk)`` say what each position held (:meth:`attnkit.torch.KVCache.codes`).
    ``weights=False``: the caller reads the cleaned k no more once its kernel has run (it
    computes no weights), so a band's fix-up may reuse that buffer (:class:`LaterFix`).
    """
    if grad is None:
        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    rows = None if keep is None else keep.rows()
    if rows is not None and (grad or not rows_zeroed):  # a NaN query with no key
        q = zero_rows(q, rows)
    if codes is not None:
        return _guard_clean(q, k, v, keep, G, codes, weights)
    if keep is None:
        return Guarded(q, k, v, None, None)
    clean_k = not keys_by_select or grad
    used = used_keys(keep, k, G)
    if used is not None:
        v = zero_rows(v, used)
        k = zero_rows(k, used) if clean_k else k
    q_fix = None
    if grad:  # dK = dS^T Q: a masked key's dS is 0, and 0 * a NaN query entry is NaN
        q, bad_q = bad_part(q)
        q_fix = _grouped(bad_q.sum(-1, keepdim=True) * 0.0, G)  # NaN: a query with NaN/inf
    heads_differ = keep.keys_differ_by_head(G)
    if not keep.partial and not heads_differ:
        return Guarded(q, k, v, q_fix, q_fix)  # every key row left is attended by all
    if keep.dense is not None or heads_differ:  # any pattern: per query row
        v, bad_v = bad_part(v)
        out_fix = dense_sum(bad_v.sum(-1), keep, G)
        k_fix = None
        if clean_k:
            k, bad_k = bad_part(k)
            k_fix = dense_sum(bad_k.sum(-1) * 0.0, keep, G)  # NaN: a key with NaN/inf
        k_fix = _plus(k_fix, q_fix)
        return Guarded(q, k, v, _plus(out_fix, k_fix), k_fix)
    # A band (and per-query lengths): prefix sums over the keys.
    k_fix = None
    if clean_k and (grad or weights):  # the cleaned keys are read again: their fix now
        k, bad_k = bad_part(k)
        k_fix = band_sum(bad_k.sum(-1, keepdim=True) * 0.0, keep, G)
    if grad:
        v, bad_v = bad_part(v)
        k_fix = _plus(k_fix, q_fix)
        return Guarded(q, k, v, _plus(band_sum(bad_v, keep, G), k_fix), k_fix)
    # Without autograd the rest is formed after the kernel, in the cleaned copies' buffers.
    clean_v = torch.nan_to_num(v, 0.0, 0.0, 0.0)
    later = LaterFix(v, clean_v, keep, G, k_fix=k_fix)
    if clean_k and k_fix is None:
        clean = torch.nan_to_num(k, 0.0, 0.0, 0.0)
        later, k = later._replace(k=k, clean_k=clean), clean
    return Guarded(q, k, clean_v, later, k_fix)


def _grouped(x: torch.Tensor, G: int) -> torch.Tensor:
    """A per-query-head fix ``(..., H, Tq, X)`` in the layout of a GQA group's fixes,
    ``(..., Hkv, G, Tq, X)`` (itself when ``G == 1``)."""
    return x if G == 1 else x.unflatten(-3, (x.shape[-3] // G, G))


def _plus(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    """``a + b`` where either fix may be None (nothing to add)."""
    return b if a is None else a if b is None else a + b


def _guard_clean(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: Keep | None, G: int,
    codes: torch.Tensor, weights: bool = True,
) -> Guarded:
    """:func:`guard_inputs` for k and v free of NaN/inf, whose positions held ``codes``:
    nothing to zero (the queries with no key are done), and the codes of the positions
    each query may attend to add back (a whole-row NaN or +-inf: the cache keeps one code per
    position)."""
    if keep is None or (keep.only_keys and not keep.keys_differ_by_head(G)):
        # The same positions for every query of a key/value head: one masked sum of both
        # rows of codes (a key mask (..., 1, Tk) broadcasts over them).
        if keep is not None:
            codes = codes.view(_BITS[codes.dtype]).bitwise_and(
                bitmask(keep.keys, codes.dtype)).view(codes.dtype)
        out_fix = codes.sum((-2, -1), keepdim=True)  # (..., Hkv, 1, 1): keys' and values'
        k_fix = codes[..., :1, :].sum(-1, keepdim=True) if weights else None
        if G > 1:
            out_fix = out_fix.unsqueeze(-3)
            k_fix = None if k_fix is None else k_fix.unsqueeze(-3)
        return Guarded(q, k, v, out_fix, k_fix)
    key_codes = codes[..., 0, :]  # (..., Hkv, Tk)
    both = key_codes + codes[..., 1, :]
    if keep.keys is None and keep.dense is None:  # a band
        return Guarded(q, k, v, band_sum(both[..., None], keep, G),
                       band_sum(key_codes[..., None].clone(), keep, G))
    return Guarded(q, k, v, dense_sum(both, keep, G), dense_sum(key_codes, keep, G))


def restore(x: torch.Tensor, fix: torch.Tensor | LaterFix | None, G: int) -> torch.Tensor:
    """``x (..., H, Tq, X)`` plus ``fix`` (a :class:`Guarded` fix-up): 0 except where a
    query attends a non-finite entry (then NaN or +-inf, as IEEE sums them). ``x`` must be
    a buffer of the caller's own (a kernel's output): without autograd it is added to in
    place."""
    if fix is None:
        return x
    if isinstance(fix, LaterFix):
        fix = fix.value()
    *lead, H, Tq, X = x.shape
    grouped = x if G == 1 else x.reshape(*lead, H // G, G, Tq, X)
    if x.requires_grad:
        return (grouped + fix).reshape(x.shape)
    return grouped.add_(fix).reshape(x.shape)  # x is the kernel's fresh output


def restore_weights(
    w: torch.Tensor, fix: torch.Tensor | None, G: int, keep: Keep | None
) -> torch.Tensor:
    """:func:`restore` for weights ``(..., H, Tq, Tk)`` (a buffer of the caller's own):
    the fix (NaN for a query that attends a key with NaN/inf) is added, and every masked
    weight is then set to exactly 0, as in the reference. The select is needed with or
    without a fix: a NaN score among a row's allowed keys (a NaN key the kernel read as it
    is) makes its whole softmax NaN, masked keys included."""
    if fix is not None:
        w = restore(w, fix, G)
    if keep is None:
        return w
    if w.requires_grad:
        return torch.where(keep.full(), w, 0.0)
    return zero_rows_(w, keep.full())  # in place: one pass, no second T x T buffer


# -- projections of padded inputs ----------------------------------------------------------


def finite_safe(
    linear: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, masked: bool
) -> torch.Tensor:
    """``linear(x)`` (an ``nn.Linear`` or the like) whose weight gradient reads NaN/inf in
    ``x`` as 0, when ``masked`` (some rows of ``x`` may end up unattended) and autograd
    records.

    ``dW = dy^T x``: a padded key/value row that no query may attend, or a query row with no
    key, has ``dy = 0``, but ``0 * nan = nan`` would still spoil the whole weight gradient
    (as the NumPy reference does not). So ``linear`` gets ``x`` with its non-finite entries
    zeroed, and a row of ``x`` that held one becomes NaN in the output, as ``linear(x)``
    would make it: where the row matters, its NaN propagates. Costs a ``nan_to_num`` of
    ``x``, a row sum and an add; ``linear`` itself is called as usual (hooks run).
    """
    if not masked or not torch.is_grad_enabled():
        return linear(x)
    clean = torch.nan_to_num(x, 0.0, 0.0, 0.0)
    return linear(clean) + (x - clean).sum(dim=-1, keepdim=True) * 0.0
