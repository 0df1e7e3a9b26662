"""Where the queries and keys of one attention call of ``check_model`` sit in the model's
token sequence (:class:`~.masks.CallPlace`): their positions, which are real tokens,
causality, the sliding window or chunk of the call's layer, packed documents, and what
the layer's own mask code builds where the config does not say it (:mod:`.facts`). Mixed
into the check by :mod:`.check`."""

from __future__ import annotations

import re
from typing import Any

from .masks import CallPlace

__all__ = ["Places"]


class Places:
    """Placing methods of the check (``self`` also has ``torch``, ``text_config``,
    ``enc_dec``, ``pad0``, ``pad``, ``total``, ``dec_total``, ``docs``, ``structure``)."""

    def place(self, module: Any, name: str, B: int, Tq: int, Tk: int, *,
              n_tokens: int | None = None, structure: bool = True) -> CallPlace:
        """Where a call's queries and keys sit (``n_tokens``: as if that many tokens,
        every one real, existed; ``structure``: apply what the model's own mask code
        builds where it differs from the config, see :mod:`.facts`)."""
        torch = self.torch
        lower = name.lower()
        if self.pad0 is None:  # no token ids: the first call (an encoder's) gives the length
            self.pad0 = self.pad = torch.ones(B, Tk, dtype=torch.bool)
            self.total = Tk
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
        elif n_tokens is not None:
            total, pad = n_tokens, torch.ones(B, n_tokens, dtype=torch.bool)
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
        place = CallPlace(q_index=q_index, k_index=k_index, key_real=key_real,
                          query_real=pad[:, q_index], causal=causal, window=window,
                          chunk=chunk, left_pad=left_pad, q_doc=q_doc, k_doc=k_doc,
                          n_tokens=total)
        own = self.structure.get(name) if structure else None
        if own is not None and int(k_index.max()) < own.shape[-1]:
            place.structure = own[:, q_index][:, :, k_index]
            later = torch.arange(own.shape[-1])
            place.causal = not bool((own & (later[None, :] > later[:, None])).any())
            place.window = place.chunk = place.q_doc = place.k_doc = None
        return place

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

