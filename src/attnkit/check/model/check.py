"""``check_model``: every attention call of a transformers model, judged against the oracle
on what it received, and the first layer where two implementations part.

::

    from attnkit.check import check_model
    report = check_model(model, implementations=["eager", "sdpa", "attnkit"], generate=4)
    print(report)            # per implementation a table by layer, findings, reproducers
    assert report.ok, report.codes

The check follows the spine of every check (:mod:`attnkit.check.core.spine`,
:class:`ModelCheck`): **prepare** reads what the model's own mask code builds
(:mod:`.facts`); the **cases** are the implementations, the first one the reference, each
run over the prefill and the decoding steps; **judge** runs the model under one of them and
judges every attention call as it happens; **reproduce** saves the first failing call of
each implementation with a program that fails on it; **finish** accounts for every
attention layer of the model (:mod:`.accounting`).

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

More about the arguments of :func:`check_model`:

- ``model`` may be a path (a local folder or a ``config.json``, loaded offline, see
  :func:`attnkit.check.model.load.load_model`). Any other ``nn.Module``, or
  ``implementation`` given, is judged call by call: its calls of SDPA, ``flex_attention``
  and ``nn.MultiheadAttention`` (:func:`attnkit.check.model.any_model.check_any_model`;
  ``inputs`` is then what to call it with: a tensor, a tuple, or a dict of keyword
  arguments). ``implementation`` is a function with the signature of
  ``F.scaled_dot_product_attention`` run in place of the model's SDPA calls, or
  ``{layer pattern: function}``; a transformers model is then run once with
  ``attn_implementation="sdpa"``, and ``implementations`` and ``generate`` do not apply.
- ``inputs`` with ``position_ids`` that restart and no ``attention_mask`` are packed
  documents: no ``generate`` then.
- ``progress`` None shows the bar when stderr is a terminal, or when layers x
  implementations x steps >= 200.
- ``generate_api`` also runs transformers' own ``model.generate()`` with a dynamic and
  then a static cache (decoder-only models with a head, unpacked inputs), every call
  judged; its steps are numbered after the check's own loop (``generate + 1`` on, then
  ``2 * (generate + 1)`` on).
"""

from __future__ import annotations

import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..catalogue import ERROR, T, Text, join, severity
from ..core.spine import follow
from .accounting import account
from .compare import Comparison
from .facts import read_facts
from .judge import CallJudge
from .places import Places
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

__all__ = ["DEFAULT_IMPLEMENTATIONS", "ImplementationResult", "LayerRow", "ModelCheck",
           "ModelFinding", "ModelReport", "check_model"]

DEFAULT_IMPLEMENTATIONS = ("eager", "sdpa", "attnkit")


class _Check(CallJudge, Comparison, Steps, Places):
    """What a ``check_model`` run knows while the model runs: the model's facts (padding,
    positions, packed documents), where each call's queries and keys sit (:class:`Places`),
    the steps of each implementation's run (:class:`Steps`); each call judged
    (:class:`CallJudge`) into its session's findings, and compared with the first
    implementation's (:class:`Comparison`)."""

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

    # -- findings and reproducers -------------------------------------------------------------
    def find(self, s: Session, row: LayerRow, code: str, message: Text, measured: Text | str,
             where: dict, *, call: tuple | None = None, batch: int | None = None,
             head: int | None = None, query: int | None = None, key: int | None = None) -> None:
        """A finding of ``code`` on ``row`` of session ``s``: the row's verdict and the
        first failing layer follow an error; the finding is kept in ``s.found`` when it is
        the run's first of its code, with a reproducer when it is its first error on a
        ``call`` (the recorded inputs)."""
        bad = severity(code, "model") == ERROR
        if bad and row.verdict == "ok":
            row.verdict = code
            order = (s.step, s.call_index)
            if s.first_fail_key is None or order < s.first_fail_key:
                s.first_fail_key = order
                s.result.first_failing_layer = T("model.layer-step", layer=row.layer,
                                                 step=s.step)
        if code in (f.code for f in s.found):
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
            f.reproducer = self.reproduce(s, (f, call))
        s.found.append(f)

    def reproduce(self, s: Session, verdict: tuple[ModelFinding, tuple]) -> str:
        """The reproducer of ``verdict``, ``(finding, the call's recorded inputs)``: the
        inputs saved under ``save_to`` (a new temporary folder on the check's first), the
        file kept as ``s``'s reproducer; the program, or why it could not be saved."""
        f, call = verdict
        try:
            if self.save_to is None:  # one new folder per check, made when needed
                self.save_to = tempfile.mkdtemp(prefix="attnkit-check-")
            path, text = model_reproducer(Path(self.save_to), s.impl, f, call, f.measured)
        except Exception as err:  # a reproducer must never hide the finding
            return T("model.reproducer-unsaved", error=first_line(err))
        s.result.reproducer = str(path)
        return text


class ModelCheck:
    """``check_model`` on a transformers model along the spine
    (:mod:`attnkit.check.core.spine`): prepare (what the model's own mask code builds, read
    once), cases (one :class:`~.session.Session` per implementation, the reference first,
    each over the prefill and the decoding steps), judge (the model run under one
    implementation, every attention call judged as it happens, so memory holds one
    layer's inputs; each run compared with the reference's), reproduce (the first failing
    call of each implementation), finish (every attention layer a row, one no judged call
    came from "not checked" with why).

    Args:
        model: a transformers ``PreTrainedModel`` (put back in its mode by :meth:`close`).
        inputs: the inputs, checked (:func:`.load.inputs_for`).
        implementations: the implementations to run, the first one the reference.
        report: the report written into, its header written.
        generate, sample, save_to, progress, generate_api: as :func:`check_model` has them.
    """

    def __init__(self, model: Any, inputs: dict, implementations: list[str],
                 report: ModelReport, *, generate: int, sample: int | None,
                 save_to: str | Path | None, progress: bool | None,
                 generate_api: bool) -> None:
        self.report = report
        self.implementations = implementations
        self.progress = progress
        self.training = model.training
        self.calls = _Check(model, inputs, generate, sample, save_to)
        self.calls.generate_api = generate_api
        # one implementation: no outputs kept to compare with
        self.calls.compared = len(implementations) > 1
        self.ran: list[Session] = []  # the runs that got to run the model

    def prepare(self) -> bool:
        """Eval mode, the facts of the model's own mask code, the progress bar."""
        check = self.calls
        check.model.eval()
        read_facts(check, self.report, check.inputs, check.generate)
        progress, impls = self.progress, self.implementations
        if progress is None:  # a terminal, or a model whose check takes a while
            config = check.model.config.get_text_config()
            layers = getattr(config, "num_hidden_layers", 0) or 0
            progress = sys.stderr.isatty() or layers * len(impls) * (check.generate + 1) >= 200
        check.bar = _bar(len(impls) * (check.generate + 1), progress)
        return True

    def cases(self) -> list[Session]:
        """One run per implementation, in the order given (the first is the reference)."""
        return [Session(self.calls, impl, n == 0) for n, impl in enumerate(self.implementations)]

    def judge(self, s: Session) -> Iterator[ModelFinding]:
        """Run the model under ``s``'s implementation, every attention call judged as it
        happens; then the run's differences to the reference (made here or inherited), and
        its findings. They are made inside the model's forward (the wrapper calls back),
        so the run keeps the first of each code (``s.found``) and they are yielded when it
        ends."""
        self.report.implementations.append(s.result)
        if self._run(s):
            self.calls.finish(s)
            self.ran.append(s)
        yield from s.found

    def _run(self, s: Session) -> bool:
        """The prefill and decoding steps under ``s``'s implementation (then
        ``model.generate()``, with ``generate_api``); False when the model did not run to
        a result (refused: ``s.result.status`` says why)."""
        check, model = self.calls, self.calls.model
        name = register_wrapper(s.impl, s)
        before = model.config._attn_implementation
        missing = cannot_load(model, s.impl)
        if missing is not None:
            s.result.status = T("model.refused", why=missing)
            s.result.unloaded = True
            return False
        refused = _switch(model, name)
        if refused is not None:
            s.result.status = T("model.refused", why=refused)
            return False
        try:
            with check.torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check.steps(s, check.bar)
                if check.generate_api and check.generate and not check.enc_dec and \
                        "input_ids" in check.inputs and check.docs is None and \
                        getattr(model, "can_generate", lambda: False)():
                    check.through_generate(s)
        except CheckFailed as err:
            s.result.status = T("model.check-failed", step=s.step, error=err.args[0])
        except Stopped as err:
            s.result.status = (T("model.stopped", step=s.step, error=err.args[0]) if s.found
                               else T("model.refused", why=err.args[0]))
        except Exception as err:  # the model itself may fail under this implementation
            too_long = check.too_long()
            if too_long:
                s.result.status = T("model.refused", why=too_long)
                return False
            s.result.status = T("model.refused",
                                why=f"{type(err).__name__}: {first_line(err)}")
        finally:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.set_attn_implementation(before)
        return True

    def reproduce(self, case: Session, verdict: tuple[ModelFinding, tuple]) -> str:
        """The reproducer of ``verdict``, ``(finding, call)`` (:meth:`_Check.reproduce`)."""
        return self.calls.reproduce(case, verdict)

    def finish(self) -> None:
        """Every attention module of the model a row of each run (one no judged call came
        from: "not checked", with why), and the facts said as notes."""
        for s in self.ran:
            account(self.calls, s)
        self.report.notes += self.calls.notes

    def close(self) -> None:
        """Put back what the check changed: the model's mode, transformers' registries."""
        self.calls.bar.close()
        self.calls.model.train(self.training)
        unregister_wrappers()  # transformers' registries as they were before the check


def _switch(model: Any, name: str) -> str | None:
    """Switch ``model`` to the registered attention ``name``; why it refused, or None."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.set_attn_implementation(name)
    except (ValueError, ImportError, KeyError) as err:
        return first_line(err)
    if model.config._attn_implementation != name:
        return T("model.no-interface")
    return None


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


def check_model(model: Any, inputs: dict | None = None, *,
                implementations: Sequence[str] | None = None, generate: int = 0,
                sample: int | None = None, save_to: str | Path | None = None,
                batch: int = 2, length: int = 12, padding: str = "left",
                progress: bool | None = None, implementation: Any = None,
                seed: int = 0, generate_api: bool = False) -> ModelReport:
    """Judge every attention call of ``model`` under each implementation (how, and more
    about each argument: this module's docstring).

    Args:
        model: a transformers ``PreTrainedModel`` (attention through
            ``AttentionInterface``), a local folder or ``config.json``, or any other
            ``nn.Module`` (judged call by call).
        inputs: ``input_ids`` ``(B, T)``, optional ``attention_mask`` (1 = real token),
            ``position_ids`` (packed documents), ``decoder_input_ids``; None: random
            tokens. For any other module: what to call it with.
        implementations: ``attn_implementation`` names registered with
            ``AttentionInterface`` (default ``eager, sdpa, attnkit``), the first the
            reference the others are compared with.
        generate: decoding steps after the prefill, with a KV cache, fed the first
            implementation's greedy tokens.
        sample: at most this many evenly spaced heads and queries per call judged against
            the oracle (masks on every query); None: all.
        save_to: folder for the reproducers' ``.pt`` files (default: a new temporary
            folder, made at the first finding).
        batch, length, padding, seed: the random inputs (``padding``: ``"left"``,
            ``"right"`` or ``"none"``).
        progress: a progress bar on stderr (None: on a terminal, or for a long check).
        implementation: an SDPA-like function, or ``{layer pattern: function}``, run in
            place of the model's SDPA calls (see ``check_any_model``).
        generate_api: with ``generate``, also run transformers' ``model.generate()``.

    Returns:
        A :class:`ModelReport`; ``report.ok`` is False when any finding is an error, or
        when no implementation had a call judged (see each result's ``note``).

    Raises:
        ValueError: ``inputs`` that do not fit ``model``, a path that does not load, an
            unknown implementation.
    """
    from .any_model import elsewhere
    from .load import inputs_for, load_model, require_transformers

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
    inputs, described = inputs_for(model, inputs, generate, batch, length, padding, seed)
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    report = ModelReport(label or type(model).__name__, dtype,
                         described + (T("model.decoding", n=generate) if generate
                                      else T("model.prefill-only")))
    check = ModelCheck(model, inputs, impls, report, generate=generate, sample=sample,
                       save_to=save_to, progress=progress, generate_api=generate_api)
    try:
        follow(check)
    finally:
        check.close()
    report.seconds = time.perf_counter() - t0
    return report
