"""attnkit inside Hugging Face transformers models, in one line.

::

    from attnkit.integrations.transformers import register

    model = AutoModelForCausalLM.from_config(config, attn_implementation=register())

:func:`register` adds two entries under one name (``"attnkit"``): the attention function
(``AttentionInterface``) and the mask function (``AttentionMaskInterface``). Registering
only the first makes transformers hand the attention function ``mask=None``, which would
silently drop padding; registering both is what makes masks arrive as structure (causal
alignment, sliding window, padding and packed documents as ``segment_ids``) instead of a
dense ``(B, 1, Tq, Tk)`` matrix, so attnkit's fused paths stay reachable.

The attention function passes through what the model asks for: ``scaling``, dropout
(``training=module.training``), GQA (``H % Hkv == 0``, K/V never repeated), ``Dk != Dv``,
Gemma2's ``softcap``, GPT-OSS's ``s_aux`` (attention sinks), T5's ``position_bias`` (a
``bias``), and attention weights whenever the model records them (``output_attentions=True``,
GPT-2 included), computed next to the fused output with ``need_weights=True``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:  # the extra this module needs: transformers (and the torch it runs on)
    import torch
    import transformers as _transformers  # noqa: F401
except ModuleNotFoundError as _err:
    from .._optional import raise_missing

    raise_missing(_err, _err.name if _err.name in ("torch", "transformers") else "transformers",
                  extra="transformers", user="attnkit.integrations.transformers")

from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, find_packed_sequence_indices

from ..torch import attention
from ._transformers_mask import StructuredMask, mask_function

__all__ = [
    "NAME",
    "StructuredMask",
    "attention_forward",
    "attentions_for_text",
    "mask_function",
    "register",
]

NAME = "attnkit"

try:  # where transformers records the outputs a caller asked for (output_attentions=True)
    from transformers.utils.output_capturing import _active_collector as _collector
except ImportError:  # pragma: no cover - an older layout: rely on the keyword alone
    _collector = None


def register(name: str = NAME) -> str:
    """Register attnkit's attention function and mask function under ``name``.

    Idempotent. Pass the result as ``attn_implementation`` (``from_config``,
    ``from_pretrained``, ``model.set_attn_implementation``).

    Returns:
        ``name``.
    """
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask_function)
    return name


def _wants_weights(kwargs: dict[str, Any]) -> bool:
    """True when the caller asked for attention weights. Most models forward
    ``output_attentions`` to the attention function; GPT-2 drops it and relies on
    transformers' output recorder, which is read here instead."""
    if kwargs.get("output_attentions"):
        return True
    active = _collector.get() if _collector is not None else None
    return bool(active) and ("attentions" in active or "cross_attentions" in active)


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' ``AttentionInterface`` entry, on :func:`attnkit.torch.attention`.

    Args:
        module: the calling attention module (``training``, ``is_causal``).
        query: ``(B, H, Tq, Dk)``.
        key: ``(B, Hkv, Tk, Dk)``.
        value: ``(B, Hkv, Tk, Dv)``.
        attention_mask: a :class:`StructuredMask` (from :func:`mask_function`), a dense
            bool mask (True = may attend) or float mask (added to the scores), or None.
            None follows SDPA's integration: causal (top-left) when the module is causal
            and ``Tq > 1``.
        dropout: attention dropout probability (transformers passes 0 in eval).
        scaling: score scale; None = ``1/sqrt(Dk)``.
        **kwargs: ``softcap`` (Gemma2), ``s_aux`` (sinks, GPT-OSS), ``position_bias``
            (T5), ``output_attentions``, ``is_causal``; others are ignored.

    Returns:
        ``(out (B, Tq, H, Dv), weights (B, H, Tq, Tk) or None)``.
    """
    Tq = query.shape[-2]
    bias = kwargs.get("position_bias")
    call: dict[str, Any] = {}
    if isinstance(attention_mask, StructuredMask):
        if tuple(attention_mask.shape[-2:]) != (Tq, key.shape[-2]):
            raise ValueError(
                f"attention mask covers (Tq, Tk) = {tuple(attention_mask.shape[-2:])}, "
                f"q and k give {(Tq, key.shape[-2])}"
            )
        call = attention_mask.attention_kwargs()
    elif attention_mask is None:
        call = _structure_from_kwargs(module, Tq, key.shape[-2], kwargs)
    elif attention_mask.dtype == torch.bool:
        call["mask"] = attention_mask
    else:  # an additive float mask
        bias = attention_mask if bias is None else bias + attention_mask
    out, weights = attention(
        query, key, value, bias=bias, softcap=kwargs.get("softcap"),
        sinks=kwargs.get("s_aux"), scale=scaling, dropout_p=dropout,
        training=module.training, need_weights=_wants_weights(kwargs), **call,
    )
    return out.transpose(1, 2).contiguous(), weights


def _structure_from_kwargs(
    module: torch.nn.Module, Tq: int, Tk: int, kwargs: dict[str, Any]
) -> dict[str, Any]:
    """attnkit keywords from what transformers hands its flash-attention kernels when there
    is no mask: ``is_causal`` (or ``module.is_causal``), ``sliding_window``, and packed
    sequences as ``cu_seq_lens_q/k`` or ``position_ids``."""
    call: dict[str, Any] = {}
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", False) if is_causal is None else is_causal
    # Bottom-right aligned, as flash-attention aligns causal and window when Tq != Tk (with
    # Tq == Tk the two alignments agree).
    if is_causal and Tq > 1:
        call["causal"] = True
    window = kwargs.get("sliding_window")
    if window is not None and Tk > window - 1:
        # flash-attention's window_size = (w - 1, w - 1), cut at the diagonal when causal
        call["window"] = (window - 1, 0 if is_causal else window - 1)
    if Tq == 1 or Tq != Tk:
        return call  # a decoding step or cross-attention: one sequence per row
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:
        def ids(cu: torch.Tensor) -> torch.Tensor:  # the sequence of each token, (1, T)
            positions = torch.arange(Tq, device=cu.device)
            return torch.searchsorted(cu[1:], positions, right=True)[None]

        call["segment_ids"] = (ids(cu_q), ids(cu_k))  # packed input is one flattened row
    elif kwargs.get("position_ids") is not None:
        ids = find_packed_sequence_indices(kwargs["position_ids"])
        if ids is not None:
            call["segment_ids"] = ids
    return call


def _config_only(model: str) -> bool:
    """A local folder with a model config and no weight files."""
    folder = Path(model)
    if not (folder / "config.json").is_file():
        return False
    return not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin"))


def attentions_for_text(
    model: str, text: str
) -> tuple[tuple[torch.Tensor, ...], list[str]]:
    """The attention weights of a transformers model reading ``text``, computed by attnkit.

    What ``attnkit view MODEL --text TEXT`` draws (its default model loader).

    Args:
        model: a model name or folder (``from_pretrained``), with its tokenizer. A folder
            that holds a ``config.json`` but no weights gives a model with random weights
            built from that config (for looking at a layout before any training).
        text: the input.

    Returns:
        ``(attentions, tokens)``: one ``(1, H, T, T)`` tensor per layer (the encoder's, for
        an encoder-decoder model) and the ``T`` tokens as the tokenizer spells them.
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    if _config_only(model):
        config = AutoConfig.from_pretrained(model)
        net = AutoModel.from_config(config, attn_implementation=register()).eval()
    else:
        net = AutoModel.from_pretrained(model, attn_implementation=register()).eval()
    inputs = tokenizer(text, return_tensors="pt")
    if getattr(net.config, "is_encoder_decoder", False):
        net = net.get_encoder()
    with torch.no_grad():
        out = net(**inputs, output_attentions=True)
    return tuple(out.attentions), tokenizer.convert_ids_to_tokens(inputs["input_ids"][0])
