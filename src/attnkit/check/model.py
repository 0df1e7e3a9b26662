"""``check_model``: every attention call of a transformers model, judged against the oracle
on what it received, and the first layer where two implementations part.

::

    from attnkit.check import check_model
    report = check_model(model, implementations=["eager", "sdpa", "attnkit"], generate=4)
    print(report)            # per implementation a table by layer, findings, reproducers
    assert report.ok, report.codes

How it records: for each implementation ``name``, a wrapper is registered with
transformers' ``AttentionInterface`` as ``"attnkit-check-<name>"`` (and, where ``name`` has
one, its mask function with ``AttentionMaskInterface``, so the masks made are those
``name`` gets), and the model is switched to it with ``set_attn_implementation``. The
wrapper calls the implementation under test (for ``"eager"``: the ``eager_attention_forward``
of the model's own modeling module) and judges the call right away, so the recorded inputs
(q, k, v, the mask) are held one call at a time; only the first implementation's attention
outputs and hidden states are kept, for the comparison (the size of what
``output_hidden_states`` returns anyway):

- **the output**, against :func:`attnkit.testing.reference_attention` in float64 on the
  very q, k, v, mask, ``scaling``, ``softcap``, sinks (``s_aux``) and ``position_bias`` it
  received, by the rule of ``attnkit check`` (at most 2x the error of plain math in the
  same dtype, plus 1e-5); an error beyond it is explained where another reading fits (the
  mask read the other way round, top-left causal, the sliding window ignored, another
  scale), else it is ``inaccurate``;
- **the mask**, against the mask the model's config and the padding call for, built
  without looking at what was received (:mod:`attnkit.check.model_masks`): a real query
  that may see a future, padded or out-of-window key, or may not see a real one, is a
  ``mask-mismatch`` naming layer, step, batch row, query and key;
- rows with no allowed key: how many, and what they hold (0, a uniform average, NaN).

Every implementation runs the same inputs: the prefill (step 0) and, with ``generate=N``,
N decoding steps with a KV cache, fed the greedy tokens of the first implementation.
Hidden states (``output_hidden_states``) and attention outputs are compared with the
first implementation's, layer by layer: a difference is *made here* when the layer's own
attention fails its check, else *inherited* from what came before.
"""

from __future__ import annotations

import math
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..testing import max_mean_error, reference_attention
from .model_masks import CallPlace, expected_keep, mask_difference, received_keep
from .model_report import ImplementationResult, LayerRow, ModelFinding, ModelReport
from .model_repro import model_reproducer
from .oracle import Baseline, bound_of, rule_error
from .report import CODES, ERROR

__all__ = ["DEFAULT_IMPLEMENTATIONS", "ImplementationResult", "LayerRow", "ModelFinding",
           "ModelReport", "check_model"]

DEFAULT_IMPLEMENTATIONS = ("eager", "sdpa", "attnkit")
WRAPPER_PREFIX = "attnkit-check-"
# A difference between implementations counts when it exceeds this, relative to the
# largest value compared (the findings themselves come from the oracle, not from this).
_DIFF_TOL = {"float64": 1e-9, "float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}


class _Stopped(Exception):
    """Raised through the model when the implementation under test raised."""


class _CheckFailed(Exception):
    """Raised through the model when judging a call failed (a gap in attnkit's check)."""


# -- the wrapper ------------------------------------------------------------------------------
class _Session:
    """One implementation's run: the wrapper registered for it calls :meth:`attention`."""

    def __init__(self, check: _Check, impl: str, reference: bool) -> None:
        self.check, self.impl, self.reference = check, impl, reference
        self.result = ImplementationResult(impl)
        self.rows: dict[str, LayerRow] = {}
        self.first_fail_key: tuple | None = None
        self.step = 0
        self.call_index = 0

    def function(self, module: Any) -> Any:
        if self.impl == "eager":
            fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward",
                         None)
            if fn is None:
                raise _Stopped(f"{type(module).__module__} defines no eager_attention_forward")
            return fn
        from transformers import AttentionInterface

        return AttentionInterface()[self.impl]

    def attention(self, module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                  *args: Any, **kwargs: Any) -> Any:
        fn = self.function(module)
        self.check.bar.set_postfix_str(
            f"{self.impl}, step {self.step}, {self.check.names.get(id(module), '')}",
            refresh=False)
        snap = [t.detach().clone() for t in (query, key, value)]
        index = self.call_index
        self.call_index += 1
        try:
            result = fn(module, query, key, value, attention_mask, *args, **kwargs)
        except Exception as err:  # the implementation under test may raise anything
            self.check.raised(self, module, snap, attention_mask, kwargs, fn, err)
            raise _Stopped(f"{type(err).__name__}: {_first_line(err)}") from err
        mutated = [n for n, a, b in zip("qkv", snap, (query, key, value))
                   if not _same(a, b)]
        try:
            self.check.judge(self, module, index, snap, attention_mask, kwargs, result,
                             mutated, fn)
        except Exception as err:  # attnkit's own failure: say so, never blame the function
            raise _CheckFailed(f"{type(err).__name__}: {_first_line(err)}") from err
        return result


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN where NaN (a snapshot taken before the call vs the tensor after it)."""
    import torch

    b = b.detach()
    if a.shape != b.shape:
        return False
    nan = torch.isnan(a)
    return bool(torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan]))


def _first_line(err: BaseException) -> str:
    """The first sentence of the first line of an error, at most 200 characters."""
    line = (str(err).strip().splitlines() or [""])[0]
    end = line.find(". ", 40)
    return (line[:end + 1] if 0 < end < 200 else line[:200]).strip()


# -- the check --------------------------------------------------------------------------------
class _Check:
    def __init__(self, model: Any, inputs: dict, generate: int, sample: int | None,
                 save_to: str | Path | None) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.config = model.config
        self.text_config = model.config.get_text_config()
        self.enc_dec = bool(getattr(model.config, "is_encoder_decoder", False))
        self.inputs = inputs
        self.generate = generate
        self.sample = sample
        self.save_to = save_to
        self.names = {id(m): n for n, m in model.named_modules()}
        self.reference_out: dict[tuple, Any] = {}
        self.reference_hidden: dict[tuple, Any] = {}
        self.plan: list[Any] = []  # the tokens fed at each decoding step
        self.bar: Any = _bar(0, False)
        ids = inputs["input_ids"]
        self.B = ids.shape[0]
        am = inputs.get("attention_mask")
        # the model's facts live on the CPU, whatever device the model runs on
        self.pad0 = (torch.ones(ids.shape, dtype=torch.bool) if am is None
                     else am.bool().cpu())
        self.docs = None
        pos = inputs.get("position_ids")
        if pos is not None and am is None and not self.enc_dec:
            pos = pos.cpu().expand(self.B, -1)
            first = pos[:, :1] - 1
            self.docs = (torch.diff(pos, prepend=first, dim=-1) != 1).cumsum(-1)
        self.pad = self.pad0  # grows by one column per decoding step
        self.total = ids.shape[1]  # decoder tokens so far (decoder-only: the whole row)
        self.dec_total = 0

    # -- where a call's queries and keys sit ------------------------------------------------
    def place(self, module: Any, name: str, B: int, Tq: int, Tk: int) -> CallPlace:
        torch = self.torch
        lower = name.lower()
        causal = bool(getattr(module, "is_causal", True)) and \
            bool(getattr(self.text_config, "is_causal", True))
        if self.enc_dec:
            T_enc = self.pad0.shape[1]
            enc = torch.arange(T_enc)
            cross = bool(re.search(r"cross|encdec|encoder_attn", lower)) or (
                "decoder" in lower and not causal)
            if cross or (lower.startswith("encoder") or ".encoder." in f".{lower}"):
                dec_q = torch.arange(self.dec_total - Tq, self.dec_total)
                q_index = dec_q if cross else enc
                return CallPlace(q_index=q_index, k_index=enc, key_real=self.pad0,
                                 query_real=(torch.ones(B, Tq, dtype=torch.bool) if cross
                                             else self.pad0), causal=False)
            total, pad = self.dec_total, torch.ones(B, self.dec_total, dtype=torch.bool)
        else:
            total, pad = self.total, self.pad
        q_index = torch.arange(total - Tq, total)
        k_index = torch.arange(Tk) if Tk >= total else torch.arange(total - Tk, total)
        key_real = torch.zeros(B, Tk, dtype=torch.bool)
        inside = k_index < total
        key_real[:, inside] = pad[:, k_index[inside]]
        window = chunk = None
        layer_type = self.layer_type(module)
        if layer_type == "sliding_attention":
            window = getattr(self.text_config, "sliding_window", None)
        elif layer_type == "chunked_attention":
            chunk = getattr(self.text_config, "attention_chunk_size", None)
        left_pad = (~pad).long().cumprod(-1).sum(-1) if chunk else None
        q_doc = k_doc = None
        if self.docs is not None:
            q_doc, k_doc = self.docs[:, q_index], self.docs[:, k_index.clamp(max=total - 1)]
        return CallPlace(q_index=q_index, k_index=k_index, key_real=key_real,
                         query_real=pad[:, q_index], causal=causal, window=window,
                         chunk=chunk, left_pad=left_pad, q_doc=q_doc, k_doc=k_doc,
                         n_tokens=total)

    def layer_type(self, module: Any) -> str:
        cfg = self.text_config
        types = getattr(cfg, "layer_types", None)
        idx = getattr(module, "layer_idx", None)
        if types and idx is not None and 0 <= idx < len(types):
            return types[idx]
        if not types and getattr(cfg, "sliding_window", None) and \
                getattr(cfg, "use_sliding_window", True):
            return "sliding_attention"
        return "full_attention"

    # -- judging one call ---------------------------------------------------------------------
    def judge(self, s: _Session, module: Any, index: int, snap: list, mask: Any, kwargs: dict,
              result: Any, mutated: list[str], fn: Any) -> None:
        torch = self.torch
        q, k, v = snap
        B, H, Tq, Dk = q.shape
        Tk, Dv = k.shape[-2], v.shape[-1]
        name = self.names.get(id(module), type(module).__name__)
        row = s.rows.get(name)
        if row is None:
            row = s.rows[name] = LayerRow(name)
            s.result.layers.append(row)
        row.calls += 1
        where = {"step": s.step, "layer": name}
        if mutated:
            self.find(s, row, "mutates-input", f"the attention function writes into its "
                      f"argument(s) {', '.join(mutated)} (an in-place op): the model's "
                      f"cache or projections change under it", "", where)
        out = result[0] if isinstance(result, (tuple, list)) else result
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (B, Tq, H, Dv):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            hint = " (a (B, H, Tq, Dv) output not transposed?)" \
                if shape == (B, H, Tq, Dv) else ""
            self.find(s, row, "shape", f"the attention function returned {shape}, "
                      f"transformers expects (B, Tq, H, Dv) = {(B, Tq, H, Dv)}{hint}", "",
                      where)
            return
        keep, bias, words = received_keep(mask, module, kwargs, q, k)
        if words not in s.result.masks:
            s.result.masks.append(words)
        keep4 = keep.expand(B, H, Tq, Tk)
        place = self.place(module, name, B, Tq, Tk)
        want = expected_keep(place)
        got = out.detach().transpose(1, 2).double().cpu()  # (B, H, Tq, Dv)
        self.compare(s, row, index, out, place)
        diff = mask_difference(keep, want, place)
        if diff is not None:
            if diff["allowed"]:
                text = (f"the mask this call received lets query {diff['query']} (position "
                        f"{diff['q_pos']}) of batch row {diff['batch']} see key {diff['key']} "
                        f"(position {diff['k_pos']}), {diff['why']}, which the model's config "
                        f"and padding exclude")
            else:
                text = (f"the mask this call received hides key {diff['key']} (position "
                        f"{diff['k_pos']}), a real key, from query {diff['query']} (position "
                        f"{diff['q_pos']}) of batch row {diff['batch']}; the model's config "
                        f"and padding allow it")
            if not row.first_failure:
                row.first_failure = (f"step {s.step}, batch {diff['batch']}, query "
                                     f"{diff['query']}, key {diff['key']}")
            self.find(s, row, "mask-mismatch", text,
                      f"{diff['count']} (row, query) pairs differ", where,
                      batch=diff["batch"], head=diff["head"], query=diff["query"],
                      key=diff["key"], call=(snap, mask, kwargs, keep4, want, place, fn, module))
        self.judge_output(s, row, module, snap, mask, kwargs, keep4, bias, got, place, want,
                          fn, where)

    def judge_output(self, s: _Session, row: LayerRow, module: Any, snap: list, mask: Any,
                     kwargs: dict, keep4: Any, bias: Any, got: Any, place: CallPlace,
                     want: Any, fn: Any, where: dict) -> None:
        torch = self.torch
        q, k, v = (t.cpu() for t in snap)  # judged on the CPU, in float64
        B, H, Tq, _ = q.shape
        nonempty = keep4.any(-1)  # (B, H, Tq)
        self.empty_rows(row, keep4, nonempty, got, v, H)
        # --sample: evenly spaced heads and queries; key/value heads follow their queries
        qsel, hsel = torch.arange(Tq), torch.arange(H)
        if self.sample and Tq > self.sample:
            qsel = torch.linspace(0, Tq - 1, self.sample).round().long().unique()
        if self.sample and H > self.sample:
            hsel = torch.linspace(0, H - 1, self.sample).round().long().unique()

        def pick(t: Any) -> Any:  # (B, H, Tq, ...) -> (B, heads, queries, ...)
            return t[:, hsel][:, :, qsel]

        judged = pick(nonempty).numpy()
        dropout = float(kwargs.get("dropout", 0.0) or 0.0)
        if not judged.any() or (dropout > 0 and getattr(module, "training", False)):
            return  # nothing to judge, or random by design (check_model runs in eval mode)
        scale = kwargs.get("scaling")
        scale = (1.0 / math.sqrt(q.shape[-1])) if scale is None else float(scale)
        softcap = kwargs.get("softcap")
        sinks = kwargs.get("s_aux")
        sinks = None if sinks is None else sinks.detach().double().cpu()[hsel].numpy()
        bias_sel = None
        if bias is not None:
            b = bias.double().cpu().expand(B, H, Tq, k.shape[-2])
            bias_sel = pick(b).numpy()
        dtype = str(q.dtype).replace("torch.", "")
        q64 = pick(q.double()).numpy()
        kv = hsel // (H // k.shape[1])  # the key/value head of each query head kept
        k64, v64 = k.double()[:, kv].numpy(), v.double()[:, kv].numpy()
        g = pick(got).numpy()

        def oracle(keep_sel: np.ndarray, scale_: float) -> tuple[np.ndarray, np.ndarray]:
            ref = reference_attention(q64, k64, v64, mask=keep_sel, bias=bias_sel,
                                      scale=scale_, softcap=softcap, sinks=sinks).out
            base = Baseline("torch", dtype).attention(
                q64, k64, v64, keep_sel, scale_, bias=bias_sel, softcap=softcap,
                sinks=sinks)["out"]
            return ref, base

        keep_sel = pick(keep4).numpy()
        ref, base = oracle(keep_sel, scale)
        err, bound = _error_and_bound(g[judged], ref[judged], base[judged])
        if row.bound == 0.0 or err / bound > row._ratio:
            row.worst_error, row.bound, row._ratio = err, bound, err / bound
        failure = rule_error(g[judged], ref[judged], base[judged], 2.0, "output")
        if failure is None:
            return
        per_row = np.abs(g - ref).max(-1)
        per_row = np.where(np.isfinite(per_row), per_row, np.inf)
        bad = judged & (per_row > bound)
        if not bad.any():
            bad = judged & ~np.isfinite(g).all(-1)
        if not bad.any():  # finite where the oracle is NaN: the first judged row
            bad = judged
        bi, hi, ii = _first(bad)
        at = dict(batch=bi, head=int(hsel[hi]), query=int(qsel[ii]))
        call = (snap, mask, kwargs, keep4, want, place, fn, module)
        text = f"step {s.step}, batch {bi}, head {at['head']}, query {at['query']}"
        if not row.first_failure:
            row.first_failure = text

        def fits(alt: Any, scale_: float = scale) -> bool:
            alt_sel = pick(alt).numpy()
            rows = alt_sel.any(-1)
            if not rows.any():
                return False
            r2, b2 = oracle(alt_sel, scale_)
            ok = rows & np.isfinite(b2).all(-1)
            return bool(ok.any()) and rule_error(g[ok], r2[ok], b2[ok], 2.0, "alt") is None

        if not np.isfinite(g[judged]).all() and np.isfinite(ref[judged]).all():
            code, message = "nan-or-inf", "the attention output has NaN/inf where the " \
                "oracle is finite"
            masked_bad = ~pick(keep4)[bi, hi, ii] & ~torch.isfinite(
                torch.cat([k[bi, kv[hi]], v[bi, kv[hi]]], -1)).all(-1)
            if bool(masked_bad.any()):
                message += (f" (k/v hold NaN/inf at {int(masked_bad.sum())} key(s) the mask "
                            f"excludes, e.g. from an earlier layer's rows with no allowed "
                            f"key: they reach the output as 0 * NaN)")
            if dtype in ("float16", "bfloat16") and self.twin_finite(fn, module, snap, mask,
                                                                     kwargs):
                code, message = "float16-overflow", (
                    f"NaN/inf in {dtype} where the same call in float32 is finite (a fill "
                    f"like -1e9 overflows half precision, or exp overflows): fill with -inf "
                    f"or torch.finfo(dtype).min and keep softmax statistics in float32")
            self.find(s, row, code, message, failure, where, call=call, **at)
            return
        if mask is not None and fits(~keep4):
            self.find(s, row, "mask-polarity", "the attention function reads the mask it "
                      "receives the other way round: it attends exactly the keys the mask "
                      "excludes", failure, where, call=call, **at)
            return
        Tk = k.shape[-2]
        if Tq != Tk:
            top_left = torch.ones(Tq, Tk, dtype=torch.bool).tril()
            if fits(keep4 & top_left):
                self.find(s, row, "causal-alignment", (
                    f"the attention function aligns causal top-left (query i sees keys "
                    f"j <= i) on a call with Tq = {Tq} != Tk = {Tk} (a step with a KV "
                    f"cache): the model means bottom-right (j <= i + Tk - Tq), so decoding "
                    f"sees the wrong keys"), failure, where, call=call, **at)
                return
        if place.window is not None:
            no_window = expected_keep(place, window=False) & ~want
            wider = keep4 | no_window[:, None]
            if bool((wider != keep4).any()) and fits(wider):
                self.find(s, row, "mask-mismatch", (
                    f"the attention function ignores the sliding window of "
                    f"{place.window} this layer has (it attends keys {place.window} or "
                    f"more positions back, which the mask it received excludes)"),
                    failure, where, call=call, **at)
                return
        default = 1.0 / math.sqrt(q.shape[-1])
        for alt, words in ((1.0, "not scaled"), (default, "scaled by 1/sqrt(Dk) instead of "
                                                 "the model's scaling")):
            if not math.isclose(alt, scale) and fits(keep4, alt):
                self.find(s, row, "wrong-scale", f"the scores are {words} (the model passes "
                          f"scaling={scale:.4g})", failure, where, call=call, **at)
                return
        self.find(s, row, "inaccurate", f"the attention output is further from the oracle "
                  f"than 2x the error of plain {dtype} math", failure, where, call=call, **at)

    def empty_rows(self, row: LayerRow, keep4: Any, nonempty: Any, got: Any, v: Any,
                   H: int) -> None:
        empty = ~nonempty
        if not bool(empty.any()):
            return
        row.empty_rows += int(empty.any(1).sum())
        G = H // v.shape[1]
        mean = v.double().mean(-2, keepdim=True).repeat_interleave(G, 1)  # (B, H, 1, Dv)
        vals = got[empty]
        means = mean.expand_as(got)[empty]
        scale = max(1.0, float(got[~empty.unsqueeze(-1).expand_as(got)].abs().max())
                    if bool(nonempty.any()) else 1.0)
        holds = []
        if bool(vals.isnan().any()):
            holds.append("NaN")
        finite = vals[vals.isfinite().all(-1)]
        fmeans = means[vals.isfinite().all(-1)]
        if finite.numel():
            zero = finite.abs().max(-1).values <= 1e-6 * scale
            uniform = (finite - fmeans).abs().max(-1).values <= 1e-2 * scale
            if bool(zero.any()):
                holds.append("0")
            if bool((uniform & ~zero).any()):
                holds.append("uniform")
            if bool((~uniform & ~zero).any()):
                holds.append("other")
        for h in holds:
            if h not in row.empty_hold:
                row.empty_hold.append(h)

    def twin_finite(self, fn: Any, module: Any, snap: list, mask: Any, kwargs: dict) -> bool:
        """The same call in float32: no exception, finite output."""
        torch = self.torch
        q, k, v = (t.float() for t in snap)
        m = mask.float() if isinstance(mask, torch.Tensor) and mask.is_floating_point() \
            else mask
        kw = {n: (x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x)
              for n, x in kwargs.items()}
        try:
            out = fn(module, q, k, v, m, **kw)
        except Exception:
            return False
        out = out[0] if isinstance(out, (tuple, list)) else out
        return bool(torch.isfinite(out).all())

    def raised(self, s: _Session, module: Any, snap: list, mask: Any, kwargs: dict, fn: Any,
               err: Exception) -> None:
        name = self.names.get(id(module), type(module).__name__)
        dtype = str(snap[0].dtype).replace("torch.", "")
        where = {"step": s.step, "layer": name}
        row = s.rows.get(name)
        if row is None:
            row = s.rows[name] = LayerRow(name)
            s.result.layers.append(row)
        row.calls += 1
        row.first_failure = row.first_failure or f"step {s.step}: raised"
        if dtype in ("float16", "bfloat16") and self.twin_finite(fn, module, snap, mask,
                                                                 kwargs):
            self.find(s, row, "float16-overflow", (
                f"the attention function raises in {dtype} but not in float32 "
                f"({type(err).__name__}: {_first_line(err)}): a constant like -1e9 does not "
                f"fit in half precision; use -inf or torch.finfo(dtype).min"),
                f"{type(err).__name__}", where,
                call=(snap, mask, kwargs, None, None, None, fn, module))

    # -- across implementations ---------------------------------------------------------------
    def compare(self, s: _Session, row: LayerRow, index: int, out: Any, place: CallPlace) -> None:
        key = (s.step, index)
        real = place.query_real  # (B, Tq)
        o = _kept(out)
        if s.reference:
            self.reference_out[key] = o
            return
        ref = self.reference_out.get(key)
        if ref is None or ref.shape != o.shape:
            return
        d = _rel_diff(o[real], ref[real])
        row.diff_attention = d if row.diff_attention is None else max(row.diff_attention, d)

    def compare_hidden(self, s: _Session, states: list[tuple[str, Any, Any]]) -> None:
        for name, h, real in states:
            key = (s.step, name)
            h = _kept(h)
            if s.reference:
                self.reference_hidden[key] = h
                continue
            ref = self.reference_hidden.get(key)
            if ref is None or ref.shape != h.shape:
                continue
            d = _rel_diff(h[real], ref[real])
            item = next((x for x in s.result.hidden if x["name"] == name), None)
            if item is None:
                s.result.hidden.append({"name": name, "diff": d})
            else:
                item["diff"] = max(item["diff"], d)
            for row in s.result.layers:  # the state after a layer goes on its rows
                if _after_layer(row.layer, name):
                    row.diff_hidden = d if row.diff_hidden is None else max(row.diff_hidden, d)

    # -- findings and reproducers -------------------------------------------------------------
    def find(self, s: _Session, row: LayerRow, code: str, message: str, measured: str,
             where: dict, *, call: tuple | None = None, batch: int | None = None,
             head: int | None = None, query: int | None = None, key: int | None = None) -> None:
        bad = CODES[code][0] == ERROR or code == "causal-alignment"
        if bad and row.verdict == "ok":
            row.verdict = code
            order = (s.step, s.call_index)
            if s.first_fail_key is None or order < s.first_fail_key:
                s.first_fail_key = order
                s.result.first_failing_layer = f"{row.layer} (step {s.step})"
        if code in (f.code for f in s.result.findings):
            return
        parts = [f"step {where['step']}" + (" (prefill)" if where["step"] == 0 else
                                            " (decoding)"), f"layer {where['layer']}"]
        parts += [f"{n} {x}" for n, x in (("batch", batch), ("head", head), ("query", query),
                                          ("key", key)) if x is not None]
        f = ModelFinding(code, message, measured, ", ".join(parts), "", s.impl, where["step"],
                         where["layer"], batch, head, query, key)
        if call is not None and bad and not s.result.reproducer:
            try:
                if self.save_to is None:  # one new folder per check, made when needed
                    self.save_to = tempfile.mkdtemp(prefix="attnkit-check-")
                path, f.reproducer = model_reproducer(Path(self.save_to), s.impl, f, call,
                                                      measured)
                s.result.reproducer = str(path)
            except Exception as err:  # a reproducer must never hide the finding
                f.reproducer = f"# the reproducer could not be saved: {_first_line(err)}"
        s.result.findings.append(f)
        order = list(CODES)
        s.result.findings.sort(key=lambda x: (x.severity != ERROR, order.index(x.code)))

    # -- running ------------------------------------------------------------------------------
    def run(self, impl: str, reference: bool, bar: Any) -> ImplementationResult:
        torch = self.torch
        session = _Session(self, impl, reference)
        name = _register(impl, session)
        model = self.model
        before = model.config._attn_implementation
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.set_attn_implementation(name)
        except (ValueError, ImportError, KeyError) as err:
            session.result.status = f"refused: {_first_line(err)}"
            return session.result
        if model.config._attn_implementation != name:
            session.result.status = ("refused: this model's attention does not go through "
                                     "transformers' AttentionInterface")
            return session.result
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.steps(session, bar)
        except _CheckFailed as err:
            session.result.status = (f"not judged: attnkit's check failed at step "
                                     f"{session.step} ({err}); please report it")
        except _Stopped as err:
            if session.result.findings:
                session.result.status = (f"stopped at step {session.step}: {err} (the "
                                         f"layers after it did not run)")
            else:
                session.result.status = f"refused: {err}"
        except Exception as err:  # the model itself may fail under this implementation
            session.result.status = f"refused: {type(err).__name__}: {_first_line(err)}"
        finally:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.set_attn_implementation(before)
        self.finish(session)
        return session.result

    def steps(self, s: _Session, bar: Any) -> None:
        torch = self.torch
        model = self.model
        device = next(model.parameters()).device
        inputs = {n: (x.to(device) if isinstance(x, torch.Tensor) else x)
                  for n, x in self.inputs.items()}
        packed = self.docs is not None
        use_cache = self.generate > 0 and not packed
        am = inputs.get("attention_mask")
        self.pad = self.pad0
        self.total = inputs["input_ids"].shape[1]
        kw: dict[str, Any] = {"output_hidden_states": True, "use_cache": use_cache,
                              "return_dict": True}
        if self.enc_dec:
            dec = inputs.get("decoder_input_ids")
            if dec is None:
                start = getattr(self.config, "decoder_start_token_id", 0) or 0
                dec = torch.full((self.B, 1), start, dtype=torch.long, device=device)
                inputs["decoder_input_ids"] = dec
            self.dec_total = dec.shape[1]
        elif am is not None and "position_ids" not in inputs and _takes(model, "position_ids"):
            inputs["position_ids"] = (am.long().cumsum(-1) - 1).clamp(min=0)
        s.step, s.call_index = 0, 0
        out = model(**inputs, **kw)
        self.hidden(s, out)
        bar.update(1)
        for step in range(1, self.generate + 1):
            s.step, s.call_index = step, 0
            if getattr(out, "logits", None) is None:
                raise ValueError(f"generate={self.generate} needs a model with a language-"
                                 f"model head (logits); {type(model).__name__} has none")
            logits = out.logits[:, -1]
            if len(self.plan) < step:
                self.plan.append(logits.argmax(-1, keepdim=True))
            nxt = self.plan[step - 1]
            past = _cache_of(out)
            cache_kw = "cache" if _takes(model, "cache") else "past_key_values"
            if self.enc_dec:
                self.dec_total += 1
                out_enc = inputs.get("_encoder_outputs") or (out.encoder_last_hidden_state,)
                inputs["_encoder_outputs"] = out_enc
                out = model(encoder_outputs=out_enc, attention_mask=inputs.get("attention_mask"),
                            decoder_input_ids=nxt, **{cache_kw: past}, **kw)
            else:
                self.total += 1
                self.pad = torch.cat([self.pad, torch.ones(self.B, 1, dtype=torch.bool)], 1)
                step_kw = {"input_ids": nxt, cache_kw: past}
                if am is not None:
                    step_kw["attention_mask"] = self.pad.long().to(device)
                    if "position_ids" in inputs:
                        last = inputs["position_ids"][:, -1:]
                        inputs["position_ids"] = last + 1
                        step_kw["position_ids"] = inputs["position_ids"]
                out = model(**step_kw, **kw)
            self.hidden(s, out)
            bar.update(1)

    def hidden(self, s: _Session, out: Any) -> None:
        torch = self.torch
        states = []
        if self.enc_dec:
            enc = getattr(out, "encoder_hidden_states", None) or ()
            if s.step == 0:
                for i, h in enumerate(enc):
                    states.append((_hidden_name("encoder", i), h, self.pad0))
            dec = getattr(out, "decoder_hidden_states", None) or ()
            for i, h in enumerate(dec):
                states.append((_hidden_name("decoder", i), h,
                               torch.ones(h.shape[:2], dtype=torch.bool)))
        else:
            for i, h in enumerate(getattr(out, "hidden_states", None) or ()):
                Tq = h.shape[1]
                states.append((_hidden_name("", i), h, self.pad[:, self.total - Tq:]))
        self.compare_hidden(s, states)

    def finish(self, s: _Session) -> None:
        dtype = str(next(self.model.parameters()).dtype).replace("torch.", "")
        tol = _DIFF_TOL.get(dtype, 1e-4)
        for row in s.result.layers:
            if row.verdict != "ok" and (CODES[row.verdict][0] == ERROR
                                        or row.verdict == "causal-alignment"):
                row.origin = "made here"
            elif row.diff_attention is not None and row.diff_attention > tol:
                row.origin = "inherited"
        if any(f.code == "fully-masked-row" for f in s.result.findings):
            return
        for row in s.result.layers:
            if "NaN" in row.empty_hold:
                self.find(s, row, "fully-masked-row", "queries with no allowed key (padding) "
                          "get NaN: through the padded tokens it can reach later layers; "
                          "attnkit, SDPA and flash-attn give 0", f"{row.empty_rows} rows",
                          {"step": 0, "layer": row.layer})
                break


def _kept(t: Any) -> Any:
    """A CPU copy to compare with: float64 stays float64, anything else goes to float32."""
    t = t.detach().cpu()
    return t if str(t.dtype) == "torch.float64" else t.float()


def _cache_of(out: Any) -> Any:
    """The KV cache a forward returned (``cache`` from transformers 5.2x, else
    ``past_key_values``)."""
    fields = getattr(out, "__dataclass_fields__", {})
    return getattr(out, "cache" if "cache" in fields else "past_key_values", None)


def _after_layer(layer: str, hidden: str) -> bool:
    """Is ``hidden`` (``"after layer 3"``, ``"decoder after layer 0"``) the output of the
    block that holds the attention module ``layer`` (``"model.layers.3.self_attn"``)?"""
    m = re.fullmatch(r"(?:(encoder|decoder) )?after layer (\d+)", hidden)
    if m is None:
        return False
    side, idx = m.group(1), m.group(2)
    parts = layer.split(".")
    if side and side not in parts[:2] and side not in layer.split(".block.")[0]:
        return False
    numbers = [p for p in parts if p.isdigit()]
    return bool(numbers) and numbers[0] == idx


def _hidden_name(side: str, i: int) -> str:
    what = "embeddings" if i == 0 else f"after layer {i - 1}"
    return f"{side} {what}".strip()


def _takes(model: Any, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _rel_diff(a: Any, b: Any) -> float:
    if a.numel() == 0:
        return 0.0
    d = (a - b).abs()
    d = float(d[d.isfinite()].max()) if bool(d.isfinite().any()) else math.inf
    if not bool(((a - b).abs().isfinite() | (a.isnan() & b.isnan())).all()):
        d = math.inf
    return d / max(1.0, float(b[b.isfinite()].abs().max()) if bool(b.isfinite().any()) else 1.0)


def _error_and_bound(got: np.ndarray, ref: np.ndarray, base: np.ndarray) -> tuple[float, float]:
    ok = np.isfinite(got)
    err = max_mean_error(got[ok], ref[ok])[0] if ok.all() else math.inf
    return err, bound_of(ref, base, 2.0)


def _first(bad: np.ndarray) -> tuple[int, int, int]:
    """``(b, h, i)`` of the first True of ``(B, H, Tq)`` in query order."""
    idx = np.argwhere(bad)
    j = np.lexsort((idx[:, 1], idx[:, 0], idx[:, 2]))[0]
    return int(idx[j, 0]), int(idx[j, 1]), int(idx[j, 2])


_SESSIONS: dict[str, Any] = {}


def _register(impl: str, session: _Session) -> str:
    """Register the wrapper of ``impl`` (and ``impl``'s mask function) under
    ``attnkit-check-<impl>``; the wrapper forwards to ``session``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if impl == "attnkit":
        from ..integrations.transformers import register

        register()
    name = WRAPPER_PREFIX + impl
    _SESSIONS[name] = session

    def wrapper(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                *args: Any, **kwargs: Any) -> Any:
        return _SESSIONS[name].attention(module, query, key, value, attention_mask, *args,
                                         **kwargs)

    if impl != "eager" and impl not in AttentionInterface():
        raise ValueError(f"attn_implementation {impl!r} is not registered with transformers' "
                         f"AttentionInterface (known: eager, "
                         f"{', '.join(AttentionInterface().valid_keys())})")
    AttentionInterface.register(name, wrapper)
    masks = AttentionMaskInterface()
    if impl in masks:
        AttentionMaskInterface.register(name, masks[impl])
    return name


def _known_implementations(impls: list[str]) -> None:
    from transformers import AttentionInterface

    if "attnkit" in impls:
        from ..integrations.transformers import register

        register()
    known = ["eager"] + [n for n in AttentionInterface().valid_keys()
                         if not n.startswith(WRAPPER_PREFIX)]
    unknown = [n for n in impls if n not in known]
    if unknown:
        raise ValueError(f"implementations {unknown} are not registered with transformers' "
                         f"AttentionInterface (known: {', '.join(known)}); register yours "
                         f"with AttentionInterface.register(name, fn)")


def _bar(total: int, enabled: bool | None) -> Any:
    class _Off:
        def update(self, n: int = 1) -> None:
            pass

        def close(self) -> None:
            pass

        def set_postfix_str(self, text: str, refresh: bool = True) -> None:
            pass

    if enabled is False:
        return _Off()
    try:
        from tqdm import tqdm
    except ImportError:
        return _Off()
    return tqdm(total=total, desc="attnkit check model", unit="step", file=sys.stderr,
                disable=not enabled, leave=False)


def check_model(model: Any, inputs: dict | None = None, *,
                implementations: Sequence[str] | None = None, generate: int = 0,
                sample: int | None = None, save_to: str | Path | None = None,
                batch: int = 2, length: int = 12, padding: str = "left",
                progress: bool | None = None) -> ModelReport:
    """Judge every attention call of ``model`` under each implementation.

    Args:
        model: a transformers ``PreTrainedModel`` (its attention must go through
            ``AttentionInterface``), or a path: a local folder or a ``config.json``
            (loaded offline, see :func:`attnkit.check.model_load.load_model`).
        inputs: ``input_ids`` ``(B, T)`` with optional ``attention_mask`` (1 = real
            token), ``position_ids`` (packed documents: ids that restart; no
            ``attention_mask``, no ``generate``), ``decoder_input_ids`` (encoder-decoder).
            None: random tokens, ``batch`` x ``length``, with ``padding``.
        implementations: ``attn_implementation`` names (default ``eager, sdpa,
            attnkit``); any name registered with ``AttentionInterface`` works. Differences
            are measured against the first.
        generate: decoding steps after the prefill, with a KV cache; every implementation
            is fed the first implementation's greedy tokens.
        sample: judge at most this many heads and this many queries per call against
            the oracle (evenly spaced; masks are compared on every query). None: all.
        save_to: folder for the reproducers' ``.pt`` files (default: a new temporary
            folder, made only when there is a finding).
        batch, length, padding: the random inputs when ``inputs`` is None (``padding``:
            ``"left"``, ``"right"`` or ``"none"``).
        progress: a progress bar on stderr over implementations and steps (None: when
            stderr is a terminal, or layers x implementations x steps >= 200).

    Returns:
        A :class:`ModelReport`; ``report.ok`` is False when any finding is an error.
    """
    from .model_load import load_model, make_inputs, require_transformers

    require_transformers()
    t0 = time.perf_counter()
    label = None
    if isinstance(model, (str, Path)):
        label = str(model)
        model = load_model(str(model))
    if generate < 0:
        raise ValueError(f"generate must be >= 0, got {generate}")
    if sample is not None and sample < 1:
        raise ValueError(f"sample must be >= 1 or None, got {sample}")
    impls = list(DEFAULT_IMPLEMENTATIONS if implementations is None else implementations)
    if not impls:
        raise ValueError("implementations is empty")
    _known_implementations(impls)
    described = None
    if inputs is None:
        inputs = make_inputs(model, batch=batch, length=length, padding=padding)
        described = f"batch {batch}, length {length}, padding {padding}"
    else:
        if "input_ids" not in inputs:
            raise ValueError(f"inputs need input_ids, got keys {sorted(inputs)}")
        ids = inputs["input_ids"]
        if ids.ndim != 2:
            raise ValueError(f"input_ids must be (B, T), got shape {tuple(ids.shape)}")
        described = f"batch {ids.shape[0]}, length {ids.shape[1]}, the caller's inputs"
    if inputs.get("position_ids") is not None and inputs.get("attention_mask") is None \
            and generate:
        raise ValueError("packed inputs (position_ids without attention_mask) are checked "
                         "in the prefill only: pass generate=0")
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    report = ModelReport(label or type(model).__name__, dtype,
                         described + (f", {generate} decoding step"
                                      f"{'s' if generate > 1 else ''}" if generate else
                                      ", prefill only"))
    training = model.training
    model.eval()
    check = _Check(model, inputs, generate, sample, save_to)
    if progress is None:  # a terminal, or a model whose check takes a while
        layers = getattr(model.config.get_text_config(), "num_hidden_layers", 0) or 0
        progress = sys.stderr.isatty() or layers * len(impls) * (generate + 1) >= 200
    bar = check.bar = _bar(len(impls) * (generate + 1), progress)
    try:
        for n, impl in enumerate(impls):
            report.implementations.append(check.run(impl, n == 0, bar))
    finally:
        bar.close()
        model.train(training)
        for impl in impls:
            _SESSIONS.pop(WRAPPER_PREFIX + impl, None)
    report.seconds = time.perf_counter() - t0
    return report
