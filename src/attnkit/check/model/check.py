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
``output_hidden_states`` returns anyway), and nothing when only one implementation runs:

- **the output**, against :func:`attnkit.testing.reference_attention` in float64 on the
  very q, k, v, mask, ``scaling``, ``softcap``, sinks (``s_aux``) and ``position_bias`` it
  received, by the rule of ``attnkit check`` (at most 2x the error of plain math in the
  same dtype, plus 1e-5); an error beyond it is explained where another reading fits (the
  mask read the other way round, top-left causal, the sliding window ignored, another
  scale), else it is ``inaccurate``;
- **the mask**, against the mask the model's config and the padding call for, built
  without looking at what was received (:mod:`attnkit.check.model.masks`): a real query
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

import re
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..catalogue import CATALOGUE, ERROR, T, Text, join, severity
from .accounting import account
from .compare import Comparison
from .facts import read_facts
from .judge import CallJudge
from .masks import CallPlace
from .report import ImplementationResult, LayerRow, ModelFinding, ModelReport
from .repro import model_reproducer
from .session import (
    CheckFailed,
    Session,
    Stopped,
    first_line,
    known_implementations,
    register_wrapper,
    unregister_wrappers,
)
from .steps import Steps, cannot_load

__all__ = ["DEFAULT_IMPLEMENTATIONS", "ImplementationResult", "LayerRow", "ModelFinding",
           "ModelReport", "check_model"]

DEFAULT_IMPLEMENTATIONS = ("eager", "sdpa", "attnkit")


class _Check(CallJudge, Comparison, Steps):
    """One ``check_model`` run: the model's facts (padding, positions, packed documents),
    where each call's queries and keys sit, the findings, and the steps of each
    implementation's run (judging: :class:`CallJudge`; comparing: :class:`Comparison`)."""

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
        self.compared = True
        self.plan: list[Any] = []  # the tokens fed at each decoding step
        self.bar: Any = _bar(0, False)
        ids = inputs.get("input_ids")
        self.B = next(x for x in inputs.values() if isinstance(x, torch.Tensor)).shape[0]
        am = inputs.get("attention_mask")
        # the model's facts live on the CPU, whatever device the model runs on; images and
        # sounds: every position real, the length known at the first call (see place)
        self.pad0 = None if ids is None else (
            torch.ones(ids.shape, dtype=torch.bool) if am is None else am.bool().cpu())
        self.docs = None
        pos = inputs.get("position_ids")
        if pos is not None and am is None and not self.enc_dec:
            pos = pos.cpu().expand(self.B, -1)
            first = pos[:, :1] - 1
            self.docs = (torch.diff(pos, prepend=first, dim=-1) != 1).cumsum(-1)
        self.pad = self.pad0  # grows by one column per decoding step
        # decoder tokens so far (decoder-only: the whole row)
        self.total = 0 if ids is None else ids.shape[1]
        self.dec_total = 0
        self.generate_api = False  # also model.generate(): see Steps.through_generate
        self.structure: dict[str, Any] = {}  # module name -> (B, L, L): see .facts
        self.notes: list[str] = []

    # -- where a call's queries and keys sit ------------------------------------------------
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

    # -- judging one call ---------------------------------------------------------------------

    def find(self, s: Session, row: LayerRow, code: str, message: Text, measured: Text | str,
             where: dict, *, call: tuple | None = None, batch: int | None = None,
             head: int | None = None, query: int | None = None, key: int | None = None) -> None:
        bad = severity(code, "model") == ERROR
        if bad and row.verdict == "ok":
            row.verdict = code
            order = (s.step, s.call_index)
            if s.first_fail_key is None or order < s.first_fail_key:
                s.first_fail_key = order
                s.result.first_failing_layer = T("model.layer-step", layer=row.layer,
                                                 step=s.step)
        if code in (f.code for f in s.result.findings):
            return
        step_word = ("model.at-path" if s.path else
                     "model.at-prefill" if where["step"] == 0 else "model.at-decoding")
        parts = [T(step_word, step=where["step"], path=s.path),
                 T("model.at-layer", layer=where["layer"])]
        parts += [T(f"model.at-{n}", i=x) for n, x in (("batch", batch), ("head", head),
                                                       ("query", query), ("key", key))
                  if x is not None]
        f = ModelFinding(code, message, measured, join(parts, "fields"), "", s.impl,
                         where["step"],
                         where["layer"], batch, head, query, key)
        if call is not None and bad and not s.result.reproducer:
            try:
                if self.save_to is None:  # one new folder per check, made when needed
                    self.save_to = tempfile.mkdtemp(prefix="attnkit-check-")
                path, f.reproducer = model_reproducer(Path(self.save_to), s.impl, f, call,
                                                      measured)
                s.result.reproducer = str(path)
            except Exception as err:  # a reproducer must never hide the finding
                f.reproducer = T("model.reproducer-unsaved", error=first_line(err))
        s.result.findings.append(f)
        order = list(CATALOGUE)
        s.result.findings.sort(key=lambda x: (x.severity != ERROR, order.index(x.code)))

    # -- running ------------------------------------------------------------------------------
    def run(self, impl: str, reference: bool, bar: Any) -> ImplementationResult:
        torch = self.torch
        session = Session(self, impl, reference)
        name = register_wrapper(impl, session)
        model = self.model
        before = model.config._attn_implementation
        missing = cannot_load(model, impl)
        if missing is not None:
            session.result.status = T("model.refused", why=missing)
            session.result.unloaded = True
            return session.result
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.set_attn_implementation(name)
        except (ValueError, ImportError, KeyError) as err:
            session.result.status = T("model.refused", why=first_line(err))
            return session.result
        if model.config._attn_implementation != name:
            session.result.status = T("model.refused", why=T("model.no-interface"))
            return session.result
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.steps(session, bar)
                if self.generate_api and self.generate and not self.enc_dec and \
                        "input_ids" in self.inputs and self.docs is None and \
                        getattr(self.model, "can_generate", lambda: False)():
                    self.through_generate(session)
        except CheckFailed as err:
            session.result.status = T("model.check-failed", step=session.step,
                                      error=err.args[0])
        except Stopped as err:
            if session.result.findings:
                session.result.status = T("model.stopped", step=session.step,
                                          error=err.args[0])
            else:
                session.result.status = T("model.refused", why=err.args[0])
        except Exception as err:  # the model itself may fail under this implementation
            too_long = self.too_long()
            if too_long:
                session.result.status = T("model.refused", why=too_long)
                return session.result
            session.result.status = T("model.refused",
                                      why=f"{type(err).__name__}: {first_line(err)}")
        finally:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.set_attn_implementation(before)
        self.finish(session)
        account(self, session)
        return session.result


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


def _implementations(implementations: Sequence[str] | None, generate: int,
                     sample: int | None) -> list[str]:
    """The implementations to run (the default ones for None), the arguments checked."""
    if generate < 0:
        raise ValueError(T("load.generate", got=generate))
    if sample is not None and sample < 1:
        raise ValueError(T("load.sample", got=sample))
    impls = list(DEFAULT_IMPLEMENTATIONS if implementations is None else implementations)
    if not impls:
        raise ValueError(T("load.no-implementations"))
    known_implementations(impls)
    return impls


def _inputs(model: Any, inputs: dict | None, generate: int, batch: int, length: int,
            padding: str, seed: int) -> tuple[dict, Text]:
    """``(inputs, how the report describes them)``: the caller's, checked against the
    model, or random ones (``batch`` x ``length`` tokens with ``padding``, or the images
    and sounds the config calls for)."""
    from .load import check_inputs, make_inputs

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


def check_model(model: Any, inputs: dict | None = None, *,
                implementations: Sequence[str] | None = None, generate: int = 0,
                sample: int | None = None, save_to: str | Path | None = None,
                batch: int = 2, length: int = 12, padding: str = "left",
                progress: bool | None = None, implementation: Any = None,
                seed: int = 0, generate_api: bool = False) -> ModelReport:
    """Judge every attention call of ``model`` under each implementation.

    Args:
        model: a transformers ``PreTrainedModel`` (its attention must go through
            ``AttentionInterface``), or a path: a local folder or a ``config.json``
            (loaded offline, see :func:`attnkit.check.model.load.load_model`). Any other
            ``nn.Module`` (or ``implementation`` given): its calls of SDPA,
            ``flex_attention`` and ``nn.MultiheadAttention`` are judged one by one
            (:func:`attnkit.check.model.any_model.check_any_model`; ``inputs`` is then
            what to call it with: a tensor, a tuple, or a dict of keyword arguments).
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
        generate_api: with ``generate``, also run transformers' own ``model.generate()``
            with a dynamic and then a static cache (decoder-only models with a head,
            unpacked inputs), every call judged; its steps are numbered after the check's
            own loop (``generate + 1`` on, then ``2 * (generate + 1)`` on).
        implementation: any model: a function with the signature of
            ``F.scaled_dot_product_attention`` that runs in place of the model's SDPA
            calls, or ``{layer pattern: function}`` (see ``check_any_model``); a
            transformers model is run with ``attn_implementation="sdpa"`` for it, once,
            and ``implementations`` and ``generate`` do not apply.
        seed: seeds the random inputs when ``inputs`` is None.

    Returns:
        A :class:`ModelReport`; ``report.ok`` is False when any finding is an error (a
        call that raised is ``call-failed``), or when no implementation had a call judged
        (each was refused: see each result's ``note``).

    Raises:
        ValueError: ``inputs`` that do not fit ``model`` (shapes, dtypes, ids past the
            vocabulary), a path that does not load, an unknown implementation.
    """
    from .any_model import elsewhere
    from .load import load_model, require_transformers

    other = elsewhere(model, inputs, implementation, implementations, generate, sample,
                      save_to, dict(batch=batch, length=length, padding=padding, seed=seed))
    if other is not None:  # any other nn.Module, or your function for the SDPA calls
        return other
    require_transformers()
    t0 = time.perf_counter()
    label = None
    if isinstance(model, (str, Path)):
        label = str(model)
        model = load_model(str(model))
    impls = _implementations(implementations, generate, sample)
    inputs, described = _inputs(model, inputs, generate, batch, length, padding, seed)
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    report = ModelReport(label or type(model).__name__, dtype,
                         described + (T("model.decoding", n=generate) if generate
                                      else T("model.prefill-only")))
    training = model.training
    model.eval()
    check = _Check(model, inputs, generate, sample, save_to)
    check.generate_api = generate_api
    check.compared = len(impls) > 1  # one implementation: no outputs kept to compare with
    read_facts(check, report, inputs, generate)
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
        unregister_wrappers()  # transformers' registries as they were before the check
    report.notes += check.notes
    report.seconds = time.perf_counter() - t0
    return report
