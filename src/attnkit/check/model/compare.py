"""Comparing implementations in ``check_model``: each call's attention output and each
hidden state against the first implementation's, over real tokens, and whether a layer's
difference is made there (its own attention fails) or inherited. Mixed into the check by
:mod:`attnkit.check.model.check`."""

from __future__ import annotations

import math
import re
from typing import Any

from ..catalogue import T, Text
from ..core.report import CODES, ERROR
from .masks import CallPlace
from .report import LayerRow

__all__ = ["Comparison"]

# A difference between implementations counts when it exceeds this, relative to the
# largest value compared (the findings themselves come from the oracle, not from this).
_DIFF_TOL = {"float64": 1e-9, "float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}


class Comparison:
    """Comparison methods of the check (``self`` also has ``torch``, ``model``, ``pad``,
    ``pad0``, ``total``, ``enc_dec``, ``reference_out``, ``reference_hidden``, ``find``, and
    ``compared``: False when only one implementation runs, so nothing is kept)."""

    def compare(self, s: Any, row: LayerRow, index: int, out: Any, place: CallPlace) -> None:
        if not self.compared:  # one implementation: nothing to compare, nothing kept
            return
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

    def compare_hidden(self, s: Any, states: list[tuple[str, Any, Any]]) -> None:
        if not self.compared:
            return
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

    def hidden(self, s: Any, out: Any) -> None:
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

    def finish(self, s: Any) -> None:
        dtype = str(next(self.model.parameters()).dtype).replace("torch.", "")
        tol = _DIFF_TOL.get(dtype, 1e-4)
        for row in s.result.layers:
            if row.verdict != "ok" and (CODES[row.verdict][0] == ERROR
                                        or row.verdict == "causal-alignment"):
                row.origin = "made here"  # words of the catalogue: model.made here
            elif row.diff_attention is not None and row.diff_attention > tol:
                row.origin = "inherited"
        if any(f.code == "fully-masked-row" for f in s.found):
            return
        for row in s.result.layers:
            if "NaN" in row.empty_hold:
                self.find(s, row, "fully-masked-row", T("model.empty-nan"),
                          T("measured.rows", n=row.empty_rows),
                          {"step": row._nan_step or 0, "layer": row.layer})
                break


def _kept(t: Any) -> Any:
    """A CPU copy to compare with: float64 stays float64, anything else goes to float32."""
    t = t.detach().cpu()
    return t if str(t.dtype) == "torch.float64" else t.float()


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


def _hidden_name(side: str, i: int) -> Text:
    what = T("model.embeddings") if i == 0 else T("model.after-layer", i=i - 1)
    return T(f"model.side-{side}", what=what) if side else what


def _rel_diff(a: Any, b: Any) -> float:
    if a.numel() == 0:
        return 0.0
    d = (a - b).abs()
    d = float(d[d.isfinite()].max()) if bool(d.isfinite().any()) else math.inf
    if not bool(((a - b).abs().isfinite() | (a.isnan() & b.isnan())).all()):
        d = math.inf
    return d / max(1.0, float(b[b.isfinite()].abs().max()) if bool(b.isfinite().any()) else 1.0)
