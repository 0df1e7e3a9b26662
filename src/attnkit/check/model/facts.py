"""What a model's own code makes of its attention masks, read once before the check.

The expected mask of a call is built from the model's config (:mod:`.masks`); a config does
not say everything the code does: ModernBERT's local layers see a window on *both* sides of
the query, CLIP's text model builds a causal mask while its attention modules say
``is_causal=False``, BERT or GPT-OSS let packed documents see each other. So before the
check, the model runs once with every token real under transformers' own eager mask
function and a recording attention function (it returns zeros: the masks do not depend on
the hidden states), and each attention module's mask is kept as ``(B, L, L)`` over the
check's token positions (the prefill and its decoding steps). Where it differs from what
the config says, that layer is judged against what the code builds, and the report says
so in words (:func:`describe`). An encoder-decoder is left to the config.
"""

from __future__ import annotations

from typing import Any

import torch

from ..catalogue import T, Text, join
from .masks import CallPlace, expected_keep, received_keep

__all__ = ["PROBE_NAME", "describe", "read_facts", "read_structure"]

PROBE_NAME = "attnkit-check-facts"


def read_structure(check: Any, inputs: dict, extra_tokens: int) -> dict[str, torch.Tensor]:
    """``{module name: (B, L, L) bool}``: the keep-mask each attention module got from the
    model's own mask code, every token real, over ``L = T + extra_tokens`` positions; only
    the modules where it differs from the config's expected mask (compared call by call,
    so one layer's mask is held at a time).

    Args:
        check: the running check (``model``, ``names``, ``place``, ``docs``, ``B``).
        inputs: the check's inputs (``input_ids``, optional ``position_ids`` when packed).
        extra_tokens: decoding steps to come (their positions are read too).
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    model = check.model
    ids = inputs.get("input_ids")
    if ids is None or check.enc_dec:
        return {}
    differs: dict[str, torch.Tensor] = {}
    seen: set[str] = set()

    def record(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
               *args: Any, **kwargs: Any) -> Any:
        name = check.names.get(id(module))
        B, H, Tq = query.shape[0], query.shape[1], query.shape[-2]
        if name is not None and name not in seen and Tq == key.shape[-2] == L:
            seen.add(name)  # compared at once: only the layers that differ are kept
            keep, _, _ = received_keep(attention_mask, module, kwargs, query, key)
            keep = keep.expand(B, -1, L, L).all(1).cpu()
            place = check.place(module, name, B, L, L, n_tokens=L, structure=False)
            place.key_real = torch.ones(B, L, dtype=torch.bool)
            place.query_real = torch.ones(B, L, dtype=torch.bool)
            if not torch.equal(expected_keep(place), keep):
                differs[name] = keep
        return query.new_zeros(B, Tq, H, value.shape[-1]), None

    device = ids.device
    B, T = ids.shape
    full = ids
    if extra_tokens:
        full = torch.cat([ids, ids[:, -1:].expand(B, extra_tokens)], 1)
    L = full.shape[1]
    kw: dict[str, Any] = {"input_ids": full, "use_cache": False}
    if inputs.get("position_ids") is not None and check.docs is not None:
        kw["position_ids"] = inputs["position_ids"]
    else:
        kw["attention_mask"] = torch.ones_like(full)
    before = model.config._attn_implementation
    saved = {iface: iface._global_mapping.get(PROBE_NAME) for iface in
             (AttentionInterface, AttentionMaskInterface)}
    AttentionInterface.register(PROBE_NAME, record)
    AttentionMaskInterface.register(PROBE_NAME, AttentionMaskInterface()["eager"])
    try:
        model.set_attn_implementation(PROBE_NAME)
        if model.config._attn_implementation != PROBE_NAME:
            return {}
        with torch.no_grad():
            model(**{n: x.to(device) for n, x in kw.items() if isinstance(x, torch.Tensor)},
                  use_cache=False)
    except Exception:  # the check itself will run the model and say what fails
        return {}
    finally:
        model.set_attn_implementation(before)
        for iface, value in saved.items():
            if value is None:
                iface._global_mapping.pop(PROBE_NAME, None)
            else:
                iface._global_mapping[PROBE_NAME] = value
    return differs


def describe(name: str, keep: torch.Tensor, place: CallPlace) -> Text:
    """One sentence: what layer ``name``'s own mask ``keep`` ``(B, L, L)`` does that its
    config did not say (``place``: the config's view of the same call)."""
    L = keep.shape[-1]
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    any_row = keep.any(0)
    future = bool((any_row & (j > i)).any())
    words = []
    if not future and not place.causal:
        words.append(T("fact.causal-own"))
    if future and place.causal:
        words.append(T("fact.bidirectional"))
    ahead = int(((j - i) * any_row).max())
    back = int(((i - j) * any_row).max())
    if future and ahead < L - 1 and back < L - 1:
        words.append(T("fact.two-sided", back=back, ahead=ahead))
    elif not future and back < L - 1 and place.window is None:
        words.append(T("fact.window", n=back + 1))
    if place.q_doc is not None and bool((keep & (place.q_doc[:, :, None] !=
                                                 place.k_doc[:, None, :])).any()):
        words.append(T("fact.across-documents"))
    return T("fact.own-mask", name=name, what=join(words) if words else T("fact.other-mask"))


def read_facts(check: Any, report: Any, inputs: dict, generate: int) -> None:
    """What the model's own mask code builds where its config says otherwise (one run),
    kept on ``check.structure`` and said in ``report.notes``."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check.structure = read_structure(check, inputs, generate)
    modules = dict(check.model.named_modules())
    for name, keep in check.structure.items():
        L = keep.shape[-1]
        place = check.place(modules[name], name, keep.shape[0], L, L, n_tokens=L,
                            structure=False)
        report.notes.append(describe(name, keep, place))
