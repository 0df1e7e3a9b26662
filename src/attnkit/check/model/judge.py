"""Judging one attention call of a model (the part of ``check_model`` that looks at a
call): the output against the float64 oracle on what the call received, the received mask
against the expected one, what rows with no allowed key hold, and the explanation of an
error (the mask read the other way round, top-left causal, an ignored sliding window,
another scale). Mixed into the check by :mod:`attnkit.check.model.check`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...testing import max_mean_error, reference_attention
from ..core.oracle import Baseline, bound_of, rule_error
from .masks import CallPlace, expected_keep, mask_difference, received_keep
from .report import LayerRow
from .session import first_line

__all__ = ["CallJudge"]


class CallJudge:
    """Judging methods of the check (``self`` also has ``torch``, ``names``, ``sample``,
    ``place``, ``compare`` and ``find``)."""

    def judge(self, s: Any, module: Any, index: int, snap: list, mask: Any, kwargs: dict,
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

    def judge_output(self, s: Any, row: LayerRow, module: Any, snap: list, mask: Any,
                     kwargs: dict, keep4: Any, bias: Any, got: Any, place: CallPlace,
                     want: Any, fn: Any, where: dict) -> None:
        torch = self.torch
        q, k, v = (t.cpu() for t in snap)  # judged on the CPU, in float64
        B, H, Tq, _ = q.shape
        nonempty = keep4.any(-1)  # (B, H, Tq)
        self.empty_rows(row, keep4, nonempty, got, v, H, s.step)
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
                   H: int, step: int = 0) -> None:
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
            if row._nan_step is None:
                row._nan_step = step
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

    def raised(self, s: Any, module: Any, snap: list, mask: Any, kwargs: dict, fn: Any,
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
                f"({type(err).__name__}: {first_line(err)}): a constant like -1e9 does not "
                f"fit in half precision; use -inf or torch.finfo(dtype).min"),
                f"{type(err).__name__}", where,
                call=(snap, mask, kwargs, None, None, None, fn, module))
            return
        self.find(s, row, "call-failed", (
            f"the attention function raised {type(err).__name__} at step {s.step}, layer "
            f"{name}: {first_line(err)} (q {tuple(snap[0].shape)}, k {tuple(snap[1].shape)}, "
            f"{dtype}); the layers after it did not run"),
            f"{type(err).__name__}", where,
            call=(snap, mask, kwargs, None, None, None, fn, module))

    # -- across implementations ---------------------------------------------------------------


def _error_and_bound(got: np.ndarray, ref: np.ndarray, base: np.ndarray) -> tuple[float, float]:
    ok = np.isfinite(got)
    err = max_mean_error(got[ok], ref[ok])[0] if ok.all() else math.inf
    return err, bound_of(ref, base, 2.0)


def _first(bad: np.ndarray) -> tuple[int, int, int]:
    """``(b, h, i)`` of the first True of ``(B, H, Tq)`` in query order."""
    idx = np.argwhere(bad)
    j = np.lexsort((idx[:, 1], idx[:, 0], idx[:, 2]))[0]
    return int(idx[j, 0]), int(idx[j, 1]), int(idx[j, 2])
