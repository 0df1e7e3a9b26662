"""Models and inputs for ``check_model``: a local folder, a ``config.json``, or a tiny
random model of a known family, and random tokens with the padding asked for.

Nothing here downloads or runs code from a model: ``HF_HUB_OFFLINE=1`` and
``local_files_only=True`` on every load, never ``trust_remote_code`` (a config that needs
it is refused in one line), weights from safetensors where the folder has them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..catalogue import T, Text

__all__ = ["TINY_FAMILIES", "inputs_for", "load_model", "make_inputs", "require_transformers",
           "tiny_model"]

TINY_FAMILIES = ("llama", "mistral", "gemma2", "gpt_oss", "qwen2", "gpt2", "t5")
_DTYPES = ("float32", "float64", "bfloat16", "float16")


def require_transformers() -> Any:
    """transformers, imported offline (or the one-line install hint)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read when huggingface_hub is imported
    try:
        import torch  # noqa: F401
        import transformers
    except ModuleNotFoundError as err:
        from ..._optional import raise_missing

        raise_missing(err, err.name if err.name in ("torch", "transformers") else "transformers",
                      extra="transformers", user="attnkit check model")
    return transformers


def _dtype(name: str) -> Any:
    import torch

    if name not in _DTYPES:
        raise ValueError(T("load.dtype", choices=_DTYPES, got=name))
    return getattr(torch, name)


def _tiny_config(family: str) -> tuple[Any, Any, dict]:
    """``(config, auto class, extra from_config keywords)``: 2 layers, width 32, 4 query
    heads (2 key/value heads where the family has GQA), a sliding window of 4 where the
    family has one, weights drawn with a spread of 0.2 so attention is far from uniform."""
    tf = require_transformers()
    decoder = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                   initializer_range=0.2, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    causal = tf.AutoModelForCausalLM
    if family == "llama":
        return tf.LlamaConfig(**decoder), causal, {}
    if family == "mistral":
        return tf.MistralConfig(sliding_window=4, **decoder), causal, {}
    if family == "qwen2":  # layer 0 full, layer 1 sliding
        return tf.Qwen2Config(use_sliding_window=True, sliding_window=4, max_window_layers=1,
                              **decoder), causal, {}
    if family == "gemma2":  # softcap 50, alternating sliding/full layers
        return tf.Gemma2Config(sliding_window=4, head_dim=8, **decoder), causal, {}
    if family == "gpt_oss":  # attention sinks, alternating sliding/full layers
        return (tf.GptOssConfig(sliding_window=4, head_dim=8, num_local_experts=2,
                                num_experts_per_tok=2, **decoder), causal,
                {"experts_implementation": "eager"})
    if family == "gpt2":
        return (tf.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                              initializer_range=0.2, attn_pdrop=0.0, resid_pdrop=0.0,
                              embd_pdrop=0.0, bos_token_id=None, eos_token_id=None,
                              pad_token_id=0), causal, {})
    if family == "t5":
        return (tf.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                            num_heads=4, relative_attention_num_buckets=8, dropout_rate=0.0,
                            decoder_start_token_id=0, pad_token_id=0, eos_token_id=None),
                tf.AutoModelForSeq2SeqLM, {})
    raise ValueError(T("load.tiny", choices=", ".join(TINY_FAMILIES), got=family))


def tiny_model(family: str, dtype: str = "float32", seed: int = 0) -> Any:
    """A small random model of ``family`` (one of :data:`TINY_FAMILIES`), in eval mode.

    Args:
        family: ``"llama"``, ``"mistral"``, ``"gemma2"``, ``"gpt_oss"``, ``"qwen2"``,
            ``"gpt2"`` or ``"t5"``.
        dtype: ``"float32"``, ``"float64"``, ``"bfloat16"`` or ``"float16"``.
        seed: seeds the weights.

    Returns:
        A transformers ``PreTrainedModel`` on the CPU, attention ``"eager"``.
    """
    import torch

    config, auto, extra = _tiny_config(family)
    torch.manual_seed(seed)
    return auto.from_config(config, attn_implementation="eager", dtype=_dtype(dtype),
                            **extra).eval()


def _auto_class(tf: Any, config: Any) -> Any:
    if getattr(config, "is_encoder_decoder", False):
        return tf.AutoModelForSeq2SeqLM
    names = " ".join(getattr(config, "architectures", None) or [])
    return tf.AutoModelForCausalLM if ("CausalLM" in names or "LMHead" in names or not names) \
        else tf.AutoModel


def load_model(spec: str, dtype: str = "float32", seed: int = 0) -> Any:
    """A model from a local folder (``from_pretrained``) or a ``config.json`` (random
    weights, seeded), in eval mode; nothing is downloaded and no model code is run.

    Raises:
        ValueError: ``spec`` is not a local folder with a ``config.json`` nor a JSON file,
            or its config needs ``trust_remote_code``.
    """
    tf = require_transformers()
    path = Path(spec)
    if path.is_file() and path.suffix == ".json":
        folder, config_file = path.parent, path
    elif path.is_dir() and (path / "config.json").is_file():
        folder, config_file = path, path / "config.json"
    else:
        raise ValueError(T("load.not-found", model=spec))
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(T("load.unreadable", model=spec, file=config_file.name,
                           error=str(err))) from None
    if not isinstance(raw, dict) or "auto_map" in raw or "model_type" not in raw:
        raise ValueError(T("load.remote-code", model=spec))
    torch_dtype = _dtype(dtype)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if raw["model_type"] not in CONFIG_MAPPING_NAMES:
        raise ValueError(T("load.unknown-type", model=spec, type=raw["model_type"]))
    # Whatever transformers or safetensors raise on a config or weights that do not fit
    # (a width heads do not divide, a truncated file) is one line naming the model.
    try:
        config = tf.AutoConfig.for_model(**raw) if path.is_file() else \
            tf.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as err:
        raise ValueError(T("load.unreadable", model=spec, file=config_file.name,
                           error=_why(err))) from None
    auto = _auto_class(tf, config)
    weights = list(folder.glob("*.safetensors")) + list(folder.glob("*.bin"))
    try:
        if path.is_file() or not weights:
            import torch

            torch.manual_seed(seed)
            return auto.from_config(config, attn_implementation="eager",
                                    dtype=torch_dtype).eval()
        safetensors = any(w.suffix == ".safetensors" for w in weights)
        return auto.from_pretrained(str(folder), local_files_only=True,
                                    trust_remote_code=False, use_safetensors=safetensors,
                                    dtype=torch_dtype, attn_implementation="eager").eval()
    except Exception as err:
        key = "load.cannot-build" if path.is_file() or not weights else "load.cannot-load"
        raise ValueError(T(key, model=spec, error=f"{type(err).__name__}: {_why(err)}")) \
            from None


def _why(err: BaseException) -> str:
    """The first line of the innermost cause of ``err`` (a validation error wraps the
    sentence that says what is wrong), at most 200 characters."""
    while err.__cause__ is not None:
        err = err.__cause__
    lines = [x.strip() for x in str(err).strip().splitlines() if x.strip()]
    return (lines[0] if lines else type(err).__name__)[:200]


def make_inputs(model: Any, batch: int = 2, length: int = 12, padding: str = "left",
                seed: int = 0) -> dict:
    """Random tokens for ``model``: ``input_ids`` and ``attention_mask`` ``(batch, length)``
    (and ``decoder_input_ids`` for an encoder-decoder).

    Row 0 is never padded; row ``b`` has ``b * length // (batch + 1)`` pads on the side
    ``padding`` names (``"left"``, ``"right"`` or ``"none"``).
    """
    import torch

    if padding not in ("left", "right", "none"):
        raise ValueError(T("load.padding", got=padding))
    if batch < 1 or length < 1:
        raise ValueError(T("load.sizes", batch=batch, length=length))
    config = model.config
    g = torch.Generator().manual_seed(seed)
    main = getattr(model, "main_input_name", "input_ids")
    if main in ("pixel_values", "input_features"):
        return _signal_inputs(model, main, batch, g)
    vocab = int(getattr(config.get_text_config(), "vocab_size", 0) or 64)
    pad_id = getattr(config, "pad_token_id", None)
    pad_id = 0 if pad_id is None else int(pad_id)
    ids = torch.randint(1, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if padding != "none":
        for b in range(1, batch):
            n = min(length - 1, b * length // (batch + 1))
            if n:
                if padding == "left":
                    mask[b, :n] = 0
                else:
                    mask[b, length - n:] = 0
    ids = ids.masked_fill(mask == 0, pad_id)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if getattr(config, "is_encoder_decoder", False):
        start = getattr(config, "decoder_start_token_id", None) or 0
        dec = torch.randint(1, vocab, (batch, max(1, length // 2)), generator=g)
        dec[:, 0] = start
        inputs["decoder_input_ids"] = dec
    return inputs


def _signal_inputs(model: Any, main: str, batch: int, g: Any) -> dict:
    """Random images (``pixel_values``, ``(B, C, S, S)`` from the config's
    ``num_channels`` and ``image_size``) or sounds (``input_features``, ``(B, mel bins,
    2 * max_source_positions)``, with one start token for the decoder) for ``model``."""
    import torch

    config = model.config
    sub = getattr(config, "vision_config", None) or config
    dtype = next(model.parameters()).dtype
    if main == "pixel_values":
        size = getattr(sub, "image_size", 224)
        size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
        shape = (batch, getattr(sub, "num_channels", 3), *size)
        return {"pixel_values": torch.randn(shape, generator=g).to(dtype)}
    frames = 2 * getattr(config, "max_source_positions", 1500)
    features = torch.randn((batch, getattr(config, "num_mel_bins", 80), frames),
                           generator=g).to(dtype)
    inputs = {"input_features": features}
    if getattr(config, "is_encoder_decoder", False):
        start = getattr(config, "decoder_start_token_id", None) or 0
        inputs["decoder_input_ids"] = torch.full((batch, 1), start, dtype=torch.long)
    return inputs


def check_inputs(model: Any, inputs: dict) -> None:
    """Raise ``ValueError`` naming the caller's shapes and values when ``inputs`` cannot be
    the inputs of ``model``: ``input_ids`` not ``(B, T)`` integers in ``[0, vocab_size)``
    with ``B, T >= 1``; an ``attention_mask`` (of 0 and 1) or ``position_ids`` that do not
    match it; ``decoder_input_ids`` of another batch or vocabulary."""
    import torch

    if not isinstance(inputs, dict) or "input_ids" not in inputs:
        keys = sorted(inputs) if isinstance(inputs, dict) else type(inputs).__name__
        raise ValueError(T("load.no-input-ids", got=str(keys)))
    vocab = getattr(model.config.get_text_config(), "vocab_size", None)

    def ids_ok(name: str, batch: int | None) -> tuple[int, ...]:
        ids = inputs[name]
        if not isinstance(ids, torch.Tensor) or ids.ndim != 2:
            what = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise ValueError(T("load.ids-shape", name=name, got=str(what)))
        shape = tuple(ids.shape)
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise ValueError(T("load.ids-dtype", name=name, dtype=str(ids.dtype),
                                   shape=str(shape)))
        if min(shape) < 1:
            raise ValueError(T("load.ids-empty", name=name, shape=str(shape)))
        if batch is not None and shape[0] != batch:
            raise ValueError(T("load.ids-batch", name=name, shape=str(shape),
                               want=str(tuple(inputs["input_ids"].shape))))
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or (vocab and high >= vocab):
            raise ValueError(T("load.ids-vocab", name=name, shape=str(shape), low=low,
                               high=high, last=vocab - 1 if vocab else "?"))
        return shape

    shape = ids_ok("input_ids", None)
    am = inputs.get("attention_mask")
    if am is not None:
        got = tuple(am.shape) if isinstance(am, torch.Tensor) else type(am).__name__
        if got != shape:
            raise ValueError(T("load.mask-shape", got=str(got), shape=str(shape)))
        if not bool(((am == 0) | (am == 1)).all()):
            raise ValueError(T("load.mask-values", got=str(got),
                               values=str(sorted(set(am.unique().tolist()))[:6])))
    pos = inputs.get("position_ids")
    if pos is not None:
        got = tuple(pos.shape) if isinstance(pos, torch.Tensor) else type(pos).__name__
        if got not in (shape, (1, shape[1])):
            raise ValueError(T("load.positions-shape", got=str(got), shape=str(shape)))
    if inputs.get("decoder_input_ids") is not None:
        ids_ok("decoder_input_ids", shape[0])


def inputs_for(model: Any, inputs: dict | None, generate: int, batch: int, length: int,
               padding: str, seed: int) -> tuple[dict, Text]:
    """``(inputs, how the report describes them)``: the caller's, checked against the
    model, or random ones (``batch`` x ``length`` tokens with ``padding``, or the images
    and sounds the config calls for)."""
    if inputs is None:
        inputs = make_inputs(model, batch=batch, length=length, padding=padding, seed=seed)
        described = T("model.described", batch=batch, length=length,
                      padding=T(f"model.padding-{padding}"))
        if "input_ids" not in inputs:
            described = T("model.described-tensors", tensors=", ".join(
                f"{n} {tuple(x.shape)}" for n, x in inputs.items() if n != "decoder_input_ids"))
    else:
        check_inputs(model, inputs)
        ids = inputs["input_ids"]
        described = T("model.described-given", batch=ids.shape[0], length=ids.shape[1])
    if inputs.get("position_ids") is not None and inputs.get("attention_mask") is None \
            and generate:
        raise ValueError(T("load.packed-decoding"))
    return inputs, described
