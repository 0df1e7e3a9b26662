"""Running the model for ``check_model``: the prefill and the decoding steps with a KV
cache (every implementation fed the first one's greedy tokens), whether an implementation
can be loaded at all, and the position limit an input may run into. Mixed into the check
by :mod:`.check`."""

from __future__ import annotations

import warnings
from typing import Any

from ..catalogue import T
from .session import first_line

__all__ = ["Steps", "cannot_load"]


class Steps:
    """Running methods of the check (``self`` also has ``torch``, ``model``, ``inputs``,
    ``generate``, ``pad``, ``total``, ``plan``, ``notes``, ``hidden``)."""

    def too_long(self) -> str:
        """The inputs and decoding steps need more positions than the model has: which
        limit, in words; else ""."""
        config = self.text_config.to_dict()
        field = next((f for f in ("n_positions", "max_position_embeddings",
                                  "max_target_positions", "max_positions") if
                      isinstance(config.get(f), int)), None)
        tokens = (self.dec_total if self.enc_dec else self.total)
        if field is None or tokens <= config[field]:
            return ""
        return T("model.too-long", tokens=tokens, field=field, limit=config[field])

    def through_generate(self, s: Any) -> None:
        """``model.generate()`` with a dynamic and then a static cache, greedy, the
        decoding steps asked for, every call judged as in :meth:`steps` (steps numbered
        on from the check's own loop: ``generate + 1`` on, then ``2 * (generate + 1)`` on).
        Its tokens are its own, so nothing is compared with the first implementation."""
        torch = self.torch
        model = self.model
        ids = self.inputs["input_ids"]
        device = next(model.parameters()).device
        am = self.inputs.get("attention_mask")
        state = {"n": 0, "first": 0}

        def pre(module: Any, args: Any, kwargs: dict) -> None:
            x = kwargs.get("input_ids", args[0] if args else None)
            n = state["n"]
            s.step, s.call_index = state["first"] + n, 0
            if n == 0:
                self.total, self.pad = ids.shape[1], self.pad0
            else:
                new = x.shape[1]
                self.total += new
                self.pad = torch.cat([self.pad, torch.ones(self.B, new, dtype=torch.bool)], 1)
            state["n"] += 1

        compared, self.compared = self.compared, False
        hook = model.register_forward_pre_hook(pre, with_kwargs=True)
        try:
            for k, cache in enumerate(("dynamic", "static")):
                state["n"], state["first"] = 0, (k + 1) * (self.generate + 1)
                s.path = T("model.generate-path", cache=T(f"model.cache-{cache}"))
                model.generate(input_ids=ids.to(device), attention_mask=None if am is None
                               else am.to(device), max_new_tokens=self.generate,
                               min_new_tokens=self.generate, do_sample=False,
                               cache_implementation=cache, pad_token_id=0)
        finally:
            hook.remove()
            self.compared = compared
            s.path = ""

    def steps(self, s: Any, bar: Any) -> None:
        """Run the prefill and the decoding steps of implementation session ``s``."""
        torch = self.torch
        model = self.model
        device = next(model.parameters()).device
        inputs = {n: (x.to(device) if isinstance(x, torch.Tensor) else x)
                  for n, x in self.inputs.items()}
        packed = self.docs is not None
        use_cache = self.generate > 0 and not packed
        am = inputs.get("attention_mask")
        if "input_ids" in inputs:
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
                note = T("model.no-decoding", model=type(model).__name__)
                if note not in self.notes:
                    self.notes.append(note)
                return
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


def cannot_load(model: Any, impl: str) -> str | None:
    """Why transformers cannot load implementation ``impl`` (a package it needs is not
    installed), in one line; None when it loads (or is refused for another reason, which
    the run reports)."""
    if impl == "eager":
        return None
    before = model.config._attn_implementation
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.set_attn_implementation(impl)
    except ImportError as err:
        return first_line(err)
    except Exception:
        return None
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.set_attn_implementation(before)
    return None


def _cache_of(out: Any) -> Any:
    """The KV cache a forward returned (``cache`` from transformers 5.2x, else
    ``past_key_values``)."""
    fields = getattr(out, "__dataclass_fields__", {})
    return getattr(out, "cache" if "cache" in fields else "past_key_values", None)


def _takes(model: Any, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
