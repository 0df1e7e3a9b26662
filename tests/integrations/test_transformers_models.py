"""attnkit as a transformers ``attn_implementation`` matches eager, model by model.

One tiny random-weight model per attention feature the integration has to map (see
``_configs``: GQA, sliding windows per layer, softcap, sinks, ``Dk != Dv``, learned absolute
positions, a bidirectional encoder, T5's relative ``position_bias``). Each family is built
once per dtype: an eager model and a deep copy switched with ``set_attn_implementation``,
so both hold the same weights. For every family, in float32 and float64:

- forward, with and without ``output_attentions``, on a batch with no padding, right
  padding, left padding, and (for the decoders transformers packs) packed sequences;
- gradients of ``loss.backward()`` for every parameter;
- (float32) greedy ``generate`` on a left-padded batch, dynamic and static cache: same tokens.

Only real-token positions are compared. Padded queries differ by design: a query with no
allowed key (a left-padded causal row) gets output 0 in attnkit, where eager averages its
masked keys. Sizes: 2 layers, width 32, 4 query heads (2 key/value heads where the family
has GQA), a sliding window of 4 on sequences of 12; dropout off; weights drawn with a
spread of 0.2 (not 0.02) so that attention is far from uniform.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="the transformers integration needs `pip install attnkit[transformers]`"
)

from attnkit.integrations.transformers import register  # noqa: E402

VOCAB = 64
WINDOW = 4  # sliding window of the families that have one; sequences are longer

_DECODER = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    initializer_range=0.2, pad_token_id=0, bos_token_id=None, eos_token_id=None,
)


def _configs() -> dict[str, tuple[object, object, dict]]:
    tf = transformers
    moe = {"experts_implementation": "eager"}  # grouped_mm has no float64 on the CPU
    return {
        # GQA, rotary positions
        "llama": (tf.LlamaConfig(**_DECODER), tf.AutoModelForCausalLM, {}),
        # every layer has a sliding window
        "mistral": (tf.MistralConfig(sliding_window=WINDOW, **_DECODER),
                    tf.AutoModelForCausalLM, {}),
        # layer 0 full, layer 1 sliding
        "qwen2": (tf.Qwen2Config(use_sliding_window=True, sliding_window=WINDOW,
                                 max_window_layers=1, **_DECODER), tf.AutoModelForCausalLM, {}),
        # logit softcap (the default 50), alternating sliding/full layers
        "gemma2": (tf.Gemma2Config(sliding_window=WINDOW, head_dim=8, **_DECODER),
                   tf.AutoModelForCausalLM, {}),
        # attention sinks, alternating sliding/full layers, mixture of experts
        "gpt_oss": (tf.GptOssConfig(sliding_window=WINDOW, head_dim=8, num_local_experts=2,
                                    num_experts_per_tok=2, **_DECODER),
                    tf.AutoModelForCausalLM, moe),
        # Dk = 8 + 4 != Dv = 6 (multi-head latent attention)
        "deepseek_v3": (tf.DeepseekV3Config(
            **{**_DECODER, "num_key_value_heads": 4}, moe_intermediate_size=16,
            n_shared_experts=1, n_routed_experts=2, num_experts_per_tok=2, n_group=1,
            topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16,
            qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6), tf.AutoModelForCausalLM, moe),
        # learned absolute positions; drops output_attentions before the attention function
        "gpt2": (tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                               initializer_range=0.2, attn_pdrop=0.0, resid_pdrop=0.0,
                               embd_pdrop=0.0, bos_token_id=None, eos_token_id=None,
                               pad_token_id=0), tf.AutoModelForCausalLM, {}),
        # bidirectional encoder
        "bert": (tf.BertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=4,
                               max_position_embeddings=64, initializer_range=0.2,
                               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
                 tf.AutoModel, {}),
        # encoder-decoder, relative position_bias, cross-attention, unscaled scores
        "t5": (tf.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                           num_heads=4, relative_attention_num_buckets=8, dropout_rate=0.0,
                           decoder_start_token_id=0, pad_token_id=0, eos_token_id=None),
               tf.AutoModelForSeq2SeqLM, {}),
    }


FAMILIES = tuple(_configs())
PACKABLE = ("llama", "mistral", "qwen2", "gemma2", "gpt_oss", "deepseek_v3", "gpt2")
GENERATIVE = tuple(f for f in FAMILIES if f != "bert")


@functools.cache
def model_pair(family: str, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``(eager, attnkit)`` in eval mode, same weights."""
    cfg, auto, extra = _configs()[family]
    torch.manual_seed(0)
    eager = auto.from_config(cfg, attn_implementation="eager", dtype=dtype, **extra).eval()
    ours = copy.deepcopy(eager)
    ours.set_attn_implementation(register())
    if ours.config._attn_implementation != register():
        # transformers keeps such a model on eager (with a warning): nothing to compare;
        # test_a_model_outside_attention_interface_is_refused covers it
        pytest.skip(f"{family}'s attention does not go through AttentionInterface in "
                    f"transformers {transformers.__version__}")
    return eager, ours


T = 12  # sequence length (> the sliding window of 4)
# T5's decoder length: >= 9 so that its causal self-attention reaches SDPA's flash kernel
# with a bias that needs a gradient (a crash on transformers 5.23+ before it was fixed).
T5_DECODER = 9
DTYPES = (torch.float32, torch.float64)
TOL = {torch.float32: 5e-5, torch.float64: 1e-11}  # relative to the largest reference value


def _ids(seed: int = 1, B: int = 3, n: int = T) -> torch.Tensor:
    return torch.randint(1, 64, (B, n), generator=torch.Generator().manual_seed(seed))


def _padding(kind: str) -> torch.Tensor:
    """``(3, T)`` 0/1 mask: row 0 is never padded; rows 1 and 2 have 3 and 5 pads."""
    mask = torch.ones(3, T, dtype=torch.long)
    if kind == "right":
        mask[1, -3:] = 0
        mask[2, -5:] = 0
    elif kind == "left":
        mask[1, :3] = 0
        mask[2, :5] = 0
    return mask


def _packed_positions() -> torch.Tensor:
    """Position ids that restart where a new document starts (3 rows, 1 to 3 documents)."""
    rows = [[5, 7], [12], [3, 4, 5]]
    return torch.stack([torch.cat([torch.arange(n) for n in row]) for row in rows])


def _run(model, family: str, ids, mask=None, position_ids=None, attentions=False) -> dict:
    """Named outputs: ``out`` (logits, or BERT's last hidden state), T5's ``enc``, and the
    attention weights of each kind that was recorded."""
    kw = {"input_ids": ids, "attention_mask": mask, "output_attentions": attentions}
    if family == "t5":
        kw["decoder_input_ids"] = _ids(seed=2, n=T5_DECODER)
    elif position_ids is not None:
        # no cache: transformers detects packed sequences only when it makes none
        kw["position_ids"], kw["use_cache"] = position_ids, False
    with torch.no_grad():
        o = model(**kw)
    res = {"out": o.logits if hasattr(o, "logits") else o.last_hidden_state}
    if family == "t5":
        res["enc"] = o.encoder_last_hidden_state
    for name in ("attentions", "encoder_attentions", "decoder_attentions", "cross_attentions"):
        got = getattr(o, name, None)
        if got:
            res[name] = got
    return res


@contextlib.contextmanager
def _exact_softmax(dtype: torch.dtype) -> Iterator[None]:
    """Eager attention of most families runs its softmax in float32 whatever the model's
    dtype; in float64 that caps the reference at float32 accuracy (and turns the fill of an
    empty row into -inf, hence NaN). Inside this context a float64 softmax stays float64,
    so the reference is float64 throughout."""
    F = torch.nn.functional
    softmax = F.softmax

    def float64_softmax(x, dim=None, _stacklevel=3, dtype=None):
        if x.dtype == torch.float64 and dtype == torch.float32:
            dtype = None
        return softmax(x, dim=dim, dtype=dtype)

    F.softmax = float64_softmax if dtype == torch.float64 else softmax
    try:
        yield
    finally:
        F.softmax = softmax


def _close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    err = (got - ref).abs().max().item()
    scale = max(1.0, ref.abs().max().item())
    assert err <= TOL[dtype] * scale, f"{what}: max error {err:.3g} (scale {scale:.3g})"


# Packed sequences: only where transformers builds a packed mask (decoders it detects
# restarting position ids for); BERT and T5 have none.
FORWARD_CASES = [
    (family, case) for case in ("none", "right", "left", "packed") for family in FAMILIES
    if case != "packed" or family in PACKABLE
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("attentions", [False, True], ids=["plain", "output_attentions"])
@pytest.mark.parametrize(("family", "case"), FORWARD_CASES)
def test_forward_matches_eager(family: str, dtype: torch.dtype, case: str, attentions: bool):
    eager, ours = model_pair(family, dtype)
    ids, mask, pos = _ids(), None, None
    if case == "packed":
        pos = _packed_positions()
    elif case != "none":
        mask = _padding(case)
    with _exact_softmax(dtype):
        ref = _run(eager, family, ids, mask, pos, attentions)
    got = _run(ours, family, ids, mask, pos, attentions)
    assert ref.keys() == got.keys()
    real = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask.bool()
    for name in ref:
        if name == "out" and family == "t5":  # decoder positions are all real
            _close(got[name], ref[name], dtype, f"t5 {case} logits")
        elif name in ("out", "enc"):
            _close(got[name][real], ref[name][real], dtype, f"{family} {case} {name}")
        else:
            assert len(got[name]) == len(ref[name])
            for layer, (g, r) in enumerate(zip(got[name], ref[name])):
                # (B, H, Tq, Tk): the real tokens' rows and columns (T5's decoder has none
                # padded; its cross-attention has the encoder's keys)
                keep = torch.ones(g.shape, dtype=torch.bool)
                if name != "decoder_attentions":
                    keep = keep & real[:, None, None, :]
                if name in ("attentions", "encoder_attentions"):
                    keep = keep & real[:, None, :, None]
                _close(g[keep], r[keep], dtype, f"{family} {case} {name}[{layer}]")


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", GENERATIVE)
def test_generate_left_padded_matches_eager(family: str, cache: str):
    eager, ours = model_pair(family, torch.float32)
    ids, mask = _ids(seed=3), _padding("left")
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        ref = eager.generate(ids, **kw)
        got = ours.generate(ids, **kw)
    assert got.shape == ref.shape
    assert torch.equal(got, ref), f"{family} {cache}:\n{got}\n!=\n{ref}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_match_eager(family: str, dtype: torch.dtype):
    """``loss.backward()`` on a right-padded batch (no empty rows, so eager is finite)."""
    eager, ours = model_pair(family, dtype)
    ids, mask = _ids(seed=4), _padding("right")
    grads = []
    for model in (eager, ours):
        model.zero_grad(set_to_none=True)
        kw = {"input_ids": ids, "attention_mask": mask}
        if family == "t5":
            kw["labels"] = _ids(seed=5, n=T5_DECODER)
        elif family != "bert":
            kw["labels"] = ids.masked_fill(mask == 0, -100)
        with _exact_softmax(dtype) if model is eager else contextlib.nullcontext():
            out = model(**kw)
        loss = out.loss if family != "bert" else (out.last_hidden_state[mask.bool()] ** 2).sum()
        loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    ref, got = grads
    assert ref.keys() == got.keys() and ref
    for name in ref:
        _close(got[name], ref[name], dtype, f"{family} grad {name}")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The keyword arguments of every ``attnkit.torch.attention`` call the integration
    makes while the test runs."""
    import attnkit.integrations.transformers as integration

    seen: list[dict] = []
    attention = integration.attention

    def spy(q, k, v, **kw):
        seen.append(kw)
        return attention(q, k, v, **kw)

    monkeypatch.setattr(integration, "attention", spy)
    return seen


@pytest.mark.parametrize("family", FAMILIES)
def test_masks_arrive_as_structure(family: str, calls: list[dict]):
    """No dense mask reaches attnkit, weights come from the fused path whenever they are
    recorded (GPT-2 drops ``output_attentions`` before its attention function), and each
    family's own feature is passed through, not left to the user."""
    _, ours = model_pair(family, torch.float32)
    _run(ours, family, _ids(), _padding("left"), attentions=True)
    assert ours.config._attn_implementation == "attnkit"
    assert calls and all(kw["need_weights"] for kw in calls)
    # the padding: a key mask (B, 1, 1, Tk), never a dense (B, 1, Tq, Tk) one
    masks = [kw["mask"] for kw in calls if kw.get("mask") is not None]
    assert masks and all(m.shape[-2] == 1 for m in masks)
    if family != "bert":
        assert any(kw.get("causal") is True for kw in calls)
    feature = {"mistral": "window", "qwen2": "window", "gemma2": "softcap",
               "gpt_oss": "sinks", "t5": "bias"}.get(family)
    if feature is not None:
        assert any(kw.get(feature) is not None for kw in calls), feature


# GPT-OSS takes position ids but builds its masks without them: no packed mask (eager
# attends across documents too, and the forward test above holds it to that).
@pytest.mark.parametrize("family", [f for f in PACKABLE if f != "gpt_oss"])
def test_packed_sequences_reach_attnkit_as_segments(family: str, calls: list[dict]):
    """Restarting position ids with no cache: transformers builds a packed mask, and it
    reaches attnkit as the segment ids of the documents, not as a dense mask."""
    _, ours = model_pair(family, torch.float32)
    pos = _packed_positions()
    _run(ours, family, _ids(), position_ids=pos)
    want = torch.stack([torch.cat([torch.full((n,), i) for i, n in enumerate(row)])
                        for row in ([5, 7], [12], [3, 4, 5])])
    assert calls
    for kw in calls:
        assert kw.get("mask") is None
        q_ids, kv_ids = kw["segment_ids"]  # one pair per mask, its runs read once
        assert torch.equal(q_ids, want) and kv_ids is q_ids


def test_packed_runs_are_read_once_per_mask_not_per_layer(monkeypatch, calls: list[dict]):
    """The documents' runs are read from the ids once per forward (one mask, shared by
    every layer), and afresh for the next forward's mask, whose packing differs."""
    from attnkit.torch import _packed

    reads: list[torch.Tensor] = []
    blocks = _packed._blocks

    def counted(q_ids, kv_ids):
        reads.append(q_ids)
        return blocks(q_ids, kv_ids)

    monkeypatch.setattr(_packed, "_blocks", counted)
    eager, ours = model_pair("llama", torch.float32)
    assert ours.config.num_hidden_layers >= 2
    first = _run(ours, "llama", _ids(), position_ids=_packed_positions())
    assert len(calls) == ours.config.num_hidden_layers and len(reads) == 1
    other = torch.stack([torch.cat([torch.arange(n) for n in row])
                         for row in ([2, 10], [6, 6], [12])])
    second = _run(ours, "llama", _ids(), position_ids=other)
    assert len(reads) == 2 and not torch.equal(reads[0], reads[1])
    for got, positions in ((first, _packed_positions()), (second, other)):
        want = _run(eager, "llama", _ids(), position_ids=positions)
        _close(got["out"], want["out"], torch.float32, "packed logits")


def test_the_output_attentions_switch_is_where_attnkit_reads_it():
    """The one private surface the integration reads: where transformers records that a
    caller asked for attention weights (GPT-2 drops ``output_attentions`` before its
    attention function). If transformers moves it, this fails loudly."""
    from transformers.utils import output_capturing

    import attnkit.integrations.transformers as integration

    assert integration._collector is output_capturing._active_collector


def test_a_model_outside_attention_interface_is_refused():
    """T5 in transformers 5.4-5.14 does not call AttentionInterface and added attnkit's
    mask to its position bias (padding and causality silently lost). Built on attnkit,
    such a model fails at its first forward with an error that says why; where transformers
    routes T5 through AttentionInterface it runs on attnkit (and the other tests compare
    it with eager)."""
    cfg, auto, _ = _configs()["t5"]
    model = auto.from_config(cfg, attn_implementation=register()).eval()
    ids = _ids()
    try:
        model_pair("t5", torch.float32)
    except pytest.skip.Exception:  # this transformers keeps T5 off AttentionInterface
        with pytest.raises(RuntimeError, match="outside transformers' AttentionInterface"):
            model(input_ids=ids, decoder_input_ids=ids)
        return
    assert model(input_ids=ids, decoder_input_ids=ids).logits.isfinite().all()


def test_attention_dropout_follows_module_training():
    cfg, auto, _ = _configs()["llama"]
    cfg = type(cfg)(**{**cfg.to_dict(), "attention_dropout": 0.5})
    torch.manual_seed(0)
    model = auto.from_config(cfg, attn_implementation=register(), dtype=torch.float64)
    ids = _ids()

    def logits(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        with torch.no_grad():
            return model(ids).logits

    model.eval()
    plain = logits(0)
    assert torch.equal(plain, logits(1))
    model.train()
    dropped = logits(0)
    assert torch.equal(dropped, logits(0))  # the generator decides, nothing else
    assert not torch.allclose(dropped, plain)
    assert not torch.allclose(dropped, logits(1))


def test_from_pretrained_takes_the_name(tmp_path):
    eager, ours = model_pair("llama", torch.float32)
    eager.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation=register()
    ).eval()
    assert loaded.config._attn_implementation == "attnkit"
    ids, mask = _ids(), _padding("left")
    real = mask.bool()
    torch.testing.assert_close(_run(loaded, "llama", ids, mask)["out"][real],
                               _run(ours, "llama", ids, mask)["out"][real])


def test_attentions_for_text_feeds_attnkit_view(tmp_path):
    """The default model loader of ``attnkit view``: a saved model and tokenizer in, one
    row-stochastic ``(1, H, T, T)`` per layer and the tokens out."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from attnkit.integrations.transformers import attentions_for_text
    from attnkit.viz.view import view_file

    words = ["[UNK]", "the", "cat", "sat", "on", "mat"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    eager, _ = model_pair("llama", torch.float32)
    eager.save_pretrained(tmp_path / "m")
    fast.save_pretrained(tmp_path / "m")

    attentions, tokens = attentions_for_text(str(tmp_path / "m"), "the cat sat on the mat")
    assert tokens == ["the", "cat", "sat", "on", "the", "mat"]
    assert len(attentions) == 2 and attentions[0].shape == (1, 4, 6, 6)
    torch.testing.assert_close(attentions[0].sum(-1), torch.ones(1, 4, 6))
    assert view_file(str(tmp_path / "m"), tmp_path / "out", text="the cat sat").exists()


def test_attnkit_view_of_a_config_only_folder_uses_random_weights(tmp_path):
    """``attnkit view FOLDER`` where FOLDER has a config and a tokenizer but no weights:
    the model is built from the config (random weights) instead of failing to load."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from attnkit import cli

    words = ["[UNK]", "a", "b", "c"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    eager, _ = model_pair("llama", torch.float32)
    eager.config.save_pretrained(tmp_path / "cfg")
    fast.save_pretrained(tmp_path / "cfg")
    assert not list((tmp_path / "cfg").glob("*.safetensors"))

    assert cli.main(["view", str(tmp_path / "cfg"), "--text", "a b c a",
                     "--out", str(tmp_path / "out")]) == 0
    page = tmp_path / "out" / "cfg.html"
    assert page.is_file() and page.stat().st_size > 1000
