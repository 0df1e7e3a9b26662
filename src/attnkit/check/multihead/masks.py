"""The mask probes of ``check_multi_head``: which reading of a mask the module follows
(``masked``, ``keep``, ``additive``), that values at masked keys change nothing, and what
a query with no allowed key gets. Each takes the :class:`~attnkit.check.multihead.probe.Harness`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..catalogue import T as Tx
from ..catalogue import Text
from ..core.overflow import fill_words
from ..core.report import Finding
from ..core.repro import note, quoted
from .probe import B, E, Harness, NoMaskLayout, T, _rand

__all__ = ["mask_polarity", "mask_probes", "per_example_masks"]


def mask_polarity(h: Harness) -> str | None:
    """``"masked"``, ``"keep"`` or ``"additive"``: given a mask flagging keys 0 and 1,
    which keys does the module ignore? For each reading, the keys it says are ignored
    get a random change, a different one per key (one shared change would not do: a
    softmax over those keys cannot see it). Raises :class:`NoMaskLayout` when the
    module takes no mask layout the check knows, bool or float (one that takes a bool
    mask and raises on a float one has a layout, even when no reading explains it)."""
    x, kv = _rand(B, T, E), _rand(B, T, E, seed=1)
    noise = 2 * _rand(B, T, E, seed=5)
    # The first keys are flagged: a causal module's early rows see no later key, so the
    # rows compared for each reading are ones a causal module lets see the changed keys.
    flag = torch.zeros(T, T, dtype=torch.bool)
    flag[:, :2] = True
    no_layout, fitted = None, False
    for reading, cols in (("masked", slice(0, 2)), ("keep", slice(2, None)),
                          ("additive", slice(0, 2))):
        h.convention = "additive" if reading == "additive" else "keep"
        h.layout = None
        keep = ~flag if reading == "additive" else flag
        changed = kv.clone()
        changed[:, cols] += noise[:, cols]
        try:
            a = h.call(h.eval(h.m), kv if h.self_only else x, kv, keep=keep)
            b = h.call(h.m, changed if h.self_only else x, changed, keep=keep)
        except NoMaskLayout as err:
            no_layout = no_layout or err  # the bool tries' errors, the first made
            continue
        except Exception:
            fitted = True
            continue
        fitted = True
        if h.self_only:  # the queries are the keys: compare unchanged rows only
            other = slice(2, None) if cols.start == 0 else slice(0, 2)
            a, b = a[:, other], b[:, other]
        if torch.isfinite(a).all() and torch.allclose(a, b, atol=1e-5):
            return reading
    h.layout = None
    if no_layout is not None and not fitted:
        raise no_layout
    return None


def mask_probes(h: Harness) -> list[Finding]:
    """The mask probes, smallest evidence first: values at masked keys change nothing
    (else ``inaccurate``, or ``mask-polarity`` where the other reading holds), masks that
    differ per example (:func:`per_example_masks`), then a query with no allowed key
    (``nan-or-inf``, ``fully-masked-row``). Returns the first probe's findings that has
    any."""
    x, kv = _rand(B, T, E), _rand(B, T, E, seed=1)
    m = h.eval(h.m)
    found = _masked_keys(h, m, x, kv)
    if found:
        return found
    paired = per_example_masks(h)  # before empty rows: mixed pairs make those odd too
    if paired:
        return paired
    return _empty_row(h, m, x, kv)


def _masked_keys(h: Harness, m: Any, x: torch.Tensor, kv: torch.Tensor) -> list[Finding]:
    """Values at masked keys change no output (``x``, ``kv``: ``(B, T, E)`` queries and
    keys/values; ``m``: the module in eval mode)."""
    # Self-attention masks keys 0 and 1 and watches rows 2..4, whose own tokens do not
    # change and which a causal module lets see those keys (lengths mask the last keys).
    early = h.self_only and h.convention != "valid_lens"
    masked_cols, kept_cols = (slice(0, 2), slice(2, None)) if early \
        else (slice(3, None), slice(0, 3))
    cols_text = "[:, :2]" if early else "[:, 3:]"
    keep = torch.ones(T, T, dtype=torch.bool)
    keep[:, masked_cols] = False
    lens = None if early else torch.tensor([3, 3])
    rows = kept_cols if h.self_only else slice(None)
    noise = 2 * _rand(B, T, E, seed=8)
    bumped = kv.clone()
    bumped[:, masked_cols] += noise[:, masked_cols]  # a different change per key
    xq = kv if h.self_only else x
    bq = bumped if h.self_only else x
    a = h.call(m, xq, kv, keep=keep, lens=lens)
    b = h.call(m, bq, bumped, keep=keep, lens=lens)
    mask_lines = h.mask_text(["keep = torch.ones(5, 5, dtype=torch.bool)",
                              note(f"keep{cols_text} = False", "repro.keys-masked",
                                   a=0 if early else 3, b=1 if early else 4)],
                             None if early else "[3, 3]")
    if torch.allclose(a[:, rows], b[:, rows], atol=1e-5):
        return []
    code, msg = "inaccurate", Tx("mha.mask-ignored")
    # The other reading is tested on rows that cannot see the changed keys; a causal
    # self-attention module's early rows see none of them, whatever it reads.
    if h.convention != "valid_lens" and not (h.self_only and h.behaves_causal):
        c_ = kv.clone()
        c_[:, kept_cols] += noise[:, kept_cols]
        rows2 = masked_cols if h.self_only else slice(None)
        a2 = h.call(m, xq, kv, keep=keep)
        b2 = h.call(m, c_ if h.self_only else x, c_, keep=keep)
        # The other reading explains it only if the flipped mask hides the masked keys
        # too: a mask that only switches behaviour on (any mask -> causal) does not.
        a3 = h.call(m, xq, kv, keep=~keep)
        b3 = h.call(m, bq, bumped, keep=~keep)
        if torch.allclose(a2[:, rows2], b2[:, rows2], atol=1e-5) and torch.allclose(
                a3[:, rows], b3[:, rows], atol=1e-5):
            code = "mask-polarity"
            msg = Tx("mha.polarity", convention=h.convention)
            # Read the other way round, the masked positions' rows attend the masked keys.
            # Rows that no key moves at all are blanked: the mask is on the query axis.
            if h.self_only and torch.allclose(a2[:, rows2], h.call(m, bumped, bumped,
                                                                    keep=keep)[:, rows2],
                                              atol=1e-5):
                code, msg = "inaccurate", Tx("mha.mask-on-queries")
    change = float((a - b)[:, rows].detach().abs().max())
    return [Finding(code, msg, Tx("measured.max-change", value=change),
                    reproducer=_masked_keys_repro(h, early, mask_lines, msg))]


def _masked_keys_repro(h: Harness, early: bool, mask_lines: tuple[list[str], str],
                       msg: Any) -> Text:
    """The reproducer of :func:`_masked_keys`'s finding ``msg`` (``mask_lines``: what
    :meth:`Harness.mask_text` wrote for its mask)."""
    cols_text = "[:, :2]" if early else "[:, 3:]"
    kl, kwt = mask_lines
    kvq = "kv" if h.self_only else "x"
    n_masked = 2
    body = kl + ["kv = torch.randn(2, 5, 16)", "bumped = kv.clone()",
                 note(f"bumped{cols_text} += 2 * torch.randn(2, {n_masked}, 16)",
                      "repro.change-masked"),
                 f"a = run({h.args_text(kvq, 'kv')}, {kwt})",
                 f"b = run({h.args_text('bumped' if h.self_only else 'x', 'bumped')},"
                 f" {kwt})"]
    rows_text = ("[:, 2:]" if early else "[:, :3]") if h.self_only else ""
    return h.repro(body + [f"assert torch.allclose(a{rows_text}, b{rows_text}, atol=1e-5), "
                           + quoted(msg)])


def _empty_row(h: Harness, m: Any, x: torch.Tensor, kv: torch.Tensor) -> list[Finding]:
    """A query with no allowed key: query 0 (or, with valid_lens, all of batch row 0)
    must not average the values (``fully-masked-row``) nor give NaN (``nan-or-inf``)."""
    xq = kv if h.self_only else x
    kvq = "kv" if h.self_only else "x"
    keep = torch.ones(T, T, dtype=torch.bool)
    keep[0] = False
    lens = torch.tensor([0, T])
    bumped = kv.clone()
    bumped[:, 1:] += 3.0
    a = h.call(m, xq, kv, keep=keep, lens=lens)
    b = h.call(m, x if not h.self_only else bumped, bumped, keep=keep, lens=lens)
    row = (slice(0, 1), slice(None)) if h.key_only \
        else (slice(None), slice(0, 1))
    kl, kwt = h.mask_text(["keep = torch.ones(5, 5, dtype=torch.bool)",
                              note("keep[0] = False", "repro.query0-no-key")], f"[0, {T}]")
    sel = "[:1]" if h.key_only else "[:, :1]"
    body = kl + ["kv = torch.randn(2, 5, 16)", "bumped = kv.clone()",
                 "bumped[:, 1:] += 3.0",
                 f"a = run({h.args_text(kvq, 'kv')}, {kwt})",
                 f"b = run({h.args_text('bumped' if h.self_only else 'x', 'bumped')},"
                 f" {kwt})", f"print(a{sel}, b{sel})"]
    if not torch.isfinite(a[row]).all():
        msg = Tx("mha.empty-row-nan")
        return [Finding("nan-or-inf", msg, Tx("measured.nan-empty-row"),
                        reproducer=h.repro(body + [
                            f"assert torch.isfinite(a{sel}).all(), " + quoted(msg)]))]
    if not torch.allclose(a[row], b[row], atol=1e-5):
        why = (Tx("mha.uniform-additive") if h.convention == "additive"
               else Tx("mha.uniform-fill", fill=fill_words(h.m)))
        msg = Tx("mha.empty-row-averages", why=why)
        return [Finding("fully-masked-row", msg, Tx("measured.moves-with-values"),
                        reproducer=h.repro(body + [
                            f"assert torch.allclose(a{sel}, b{sel}), " + quoted(msg)]))]
    return []


# A different mask per example: example 0 may attend keys 0 and 1, example 1 keys 0..3.
_PER_EXAMPLE = {"btt": "keep", "b1tt": "keep[:, None]", "bt": "keep[:, -1]",
                "b1t": "keep[:, -1, None]", "b11t": "keep[:, -1, None, None]"}


def per_example_masks(h: Harness) -> list[Finding]:
    """Masks that differ per example: values at keys masked for an example change none of
    its outputs (a mask repeated over heads in the wrong order pairs masks with other
    examples). Queries 0 and 1 are watched: for self-attention their tokens do not
    change, and no key they may attend does."""
    if h.convention != "valid_lens" and h.layout not in _PER_EXAMPLE:
        return []  # (Tq, Tk): one mask for every example
    x, kv = _rand(B, T, E), _rand(B, T, E, seed=1)
    keep = torch.ones(B, T, T, dtype=torch.bool)
    keep[0, :, 2:] = False
    keep[1, :, 4:] = False
    lens = torch.tensor([2, 4])
    bumped = kv + 2 * _rand(B, T, E, seed=9) * (~keep[:, 0, :, None])  # masked keys only
    m = h.eval(h.m)
    a = h.call(m, kv if h.self_only else x, kv, keep=keep, lens=lens)
    b = h.call(m, bumped if h.self_only else x, bumped, keep=keep, lens=lens)
    if torch.allclose(a[:, :2], b[:, :2], atol=1e-5):
        return []
    if h.convention == "valid_lens":
        lines, kwt = ["valid_lens = torch.tensor([2, 4])"], f"{h.mask_name}=valid_lens"
    else:
        shaped = _PER_EXAMPLE[h.layout or "btt"]
        lines: list = [f"keep = torch.ones({B}, {T}, {T}, dtype=torch.bool)",
                       note("keep[0, :, 2:] = False", "repro.example0-keys"),
                       note("keep[1, :, 4:] = False", "repro.example1-keys")]
        if h.convention == "additive":
            lines.append(note(f"mask = torch.zeros({shaped}.shape).masked_fill(~{shaped}, "
                              f"torch.finfo(torch.float32).min)", "repro.additive"))
        else:
            flip = "~" if h.convention == "masked" else ""
            lines.append(note(f"mask = {flip}{shaped}",
                              "repro.masked" if flip else "repro.may-attend"))
        kwt = f"{h.mask_name}=mask"
    msg = Tx("mha.per-example")
    change = float((a - b)[:, :2].detach().abs().max())
    kvq = "kv" if h.self_only else "x"
    body = lines + [f"kv = torch.randn({B}, {T}, {E})",
                    "bumped = kv.clone()", note("bumped[0, 2:] += 2.0", "repro.example0-masks"),
                    note("bumped[1, 4:] += 2.0", "repro.example1-masks"),
                    f"a = run({h.args_text(kvq, 'kv')}, {kwt})",
                    f"b = run({h.args_text('bumped' if h.self_only else 'x', 'bumped')}, "
                    f"{kwt})",
                    "assert torch.allclose(a[:, :2], b[:, :2], atol=1e-5), " + quoted(msg)]
    return [Finding("inaccurate", msg, Tx("measured.max-change-01", value=change),
                    Tx("probe.per-example"),
                    reproducer=h.repro(body))]
