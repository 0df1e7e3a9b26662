"""Tiny random models of the architectures transformers ships whose attention goes through
``AttentionInterface``, for ``check_model``'s acceptance matrix (``make test-models``) and
its tests: each built on the CPU from a small config (2 layers, width 32, 4 query heads,
2 key/value heads where the architecture has GQA, a window of 4 where it has one), its
weights drawn with a spread of 0.2 so attention is far from uniform.

The sizes are set by field name on the architecture's own default config, so one table
covers decoders, encoders, encoder-decoders, vision and speech models; an architecture the
installed transformers lacks is named by :func:`zoo_model` (``LookupError``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..catalogue import T

__all__ = ["ARCHITECTURES", "Architecture", "zoo_model"]

# Sizes every config gets where it has the field (missing fields are left alone).
_SMALL: dict[str, Any] = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "max_position_embeddings": 64, "initializer_range": 0.2, "pad_token_id": 0,
    "bos_token_id": None, "eos_token_id": None, "sliding_window": 4,
    "attention_dropout": 0.0, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
    "dropout": 0.0, "hidden_dropout": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
    "attn_pdrop": 0.0, "activation_dropout": 0.0, "layer_types": None,
    "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64, "d_model": 32,
    "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
    "ffn_dim": 64, "num_layers": 2, "num_heads": 4, "d_kv": 8, "d_ff": 64,
    "moe_intermediate_size": 16, "num_local_experts": 2, "num_experts": 2,
    "n_routed_experts": 2, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "shared_expert_intermediate_size": 16, "decoder_start_token_id": 0,
    "max_source_positions": 64, "max_target_positions": 64,
}


@dataclass(frozen=True)
class Architecture:
    """One architecture of the matrix.

    Attributes:
        name: transformers' ``model_type``.
        auto: the auto class to build it with (``"AutoModelForCausalLM"``, ...), or a
            model class name of transformers.
        extra: config fields beyond :data:`_SMALL`.
        config: a config class name when the model is built from a sub-config (CLIP's
            text model), else "" (the ``model_type``'s own config).
        packed: a model whose decoders split packed documents (position ids that
            restart) or that never splits them; both are checked with packed inputs.
        head: it has a language-model head (decoding steps are checked).
    """

    name: str
    auto: str = "AutoModelForCausalLM"
    extra: tuple[tuple[str, Any], ...] = ()
    config: str = ""
    packed: bool = False
    head: bool = True


def _a(name: str, auto: str = "AutoModelForCausalLM", *, config: str = "",
       packed: bool = False, head: bool = True, **extra: Any) -> Architecture:
    return Architecture(name, auto, tuple(sorted(extra.items())), config, packed, head)


_ENC = "AutoModel"
_S2S = "AutoModelForSeq2SeqLM"
ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    _a("llama", packed=True), _a("mistral"), _a("mixtral"),
    _a("qwen2", use_sliding_window=True, max_window_layers=1), _a("qwen2_moe"),
    _a("qwen3"), _a("qwen3_moe"), _a("gemma"), _a("gemma2"),
    _a("gemma3_text", sliding_window_pattern=2), _a("cohere"), _a("cohere2"), _a("phi"),
    _a("phi3"), _a("stablelm"), _a("starcoder2"), _a("olmo"), _a("olmo2"), _a("olmoe"),
    _a("granite"), _a("granitemoe"), _a("glm"), _a("glm4"), _a("helium"),
    _a("deepseek_v3", num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16,
       qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6, n_group=1, topk_group=1,
       first_k_dense_replace=1, head_dim=4),
    _a("gpt_oss", packed=True), _a("gpt2"), _a("gpt_neox"), _a("gptj", rotary_dim=4),
    _a("opt", word_embed_proj_dim=32), _a("biogpt"), _a("smollm3"), _a("ministral"),
    _a("exaone4"), _a("arcee"), _a("seed_oss"), _a("ernie4_5"), _a("apertus"),
    _a("nemotron", partial_rotary_factor=0.5), _a("persimmon"), _a("codegen", rotary_dim=4),
    _a("bert", _ENC, packed=True, head=False), _a("roberta", _ENC, head=False),
    _a("electra", _ENC, head=False, embedding_size=32),
    _a("xlm-roberta", _ENC, head=False),
    _a("modernbert", _ENC, packed=True, head=False, local_attention=4,
       global_attn_every_n_layers=2),
    _a("clip_text_model", "CLIPTextModel", config="CLIPTextConfig", head=False, eos_token_id=2),
    _a("vit", _ENC, head=False, image_size=8, patch_size=4, num_channels=3),
    _a("clip_vision_model", "CLIPVisionModel", config="CLIPVisionConfig", head=False,
       image_size=8, patch_size=4),
    _a("whisper", "AutoModelForSpeechSeq2Seq", num_mel_bins=8, max_source_positions=8,
       decoder_start_token_id=1, suppress_tokens=None, begin_suppress_tokens=None),
    _a("t5", _S2S), _a("bart", _S2S), _a("mbart", _S2S), _a("pegasus", _S2S),
    _a("marian", _S2S),
)}


def _small_config(arch: Architecture) -> Any:
    import transformers as tf
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if arch.config:
        cls = getattr(tf, arch.config)
    else:
        if arch.name not in CONFIG_MAPPING:
            raise LookupError(T("load.no-architecture", version=tf.__version__, name=arch.name))
        cls = CONFIG_MAPPING[arch.name]
    default = cls()
    given = dict(arch.extra)
    fields = {n: v for n, v in {**_SMALL, **given}.items() if n in given or hasattr(default, n)}
    return cls(**{**default.to_dict(), **fields})


def zoo_model(name: str, dtype: str = "float32", seed: int = 0) -> Any:
    """The tiny random model of architecture ``name`` (a key of :data:`ARCHITECTURES`),
    eager attention, eval mode, on the CPU.

    Raises:
        LookupError: the installed transformers lacks the architecture.
    """
    import torch
    import transformers as tf

    arch = ARCHITECTURES[name]
    config = _small_config(arch)
    auto = getattr(tf, arch.auto)
    torch.manual_seed(seed)
    kw: dict[str, Any] = {"attn_implementation": "eager", "dtype": getattr(torch, dtype),
                          "experts_implementation": "eager"}
    if arch.auto.startswith("Auto"):
        model = auto.from_config(config, **kw)
    else:
        model = auto._from_config(config, **kw)
    return model.eval()
