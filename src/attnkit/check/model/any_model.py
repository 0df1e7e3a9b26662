"""``check_model`` on any PyTorch model: every call of ``scaled_dot_product_attention``,
``flex_attention`` and ``nn.MultiheadAttention`` it makes, judged against the float64
oracle on what it received, one call at a time.

::

    from attnkit.check import check_model
    report = check_model(my_gpt, (tokens,))                       # torch's own SDPA
    report = check_model(my_gpt, (tokens,), implementation=my_sdpa)  # yours, in every layer
    print(report)          # a table by layer, findings, a reproducer that fails
    assert report.ok, report.codes

The model runs once, in eval mode without gradients, under
:class:`~.torch_calls.CallRecorder`; each call is judged as it happens and dropped
(:mod:`.any_judge`), so memory holds one layer's inputs. With ``implementation``, a
function with SDPA's signature runs in place of the model's SDPA calls (every one, or those
of the layers a mapping names) and is what is judged. Every module that looks like
attention (walking the model) is listed; one no judged call accounts for is "not checked"
with the reason (:mod:`.accounting`).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..catalogue import T, Text, join
from ..core.report import CODES, ERROR
from ..core.spine import follow
from . import any_flex
from .accounting import NOT_CHECKED, not_checked
from .any_half import half_non_finite, half_raise
from .any_judge import Judged, judge_raised, judge_sdpa
from .any_mha import judge_mha
from .any_repro import any_reproducer
from .report import ImplementationResult, LayerRow, ModelFinding, ModelReport
from .session import first_line
from .torch_calls import AttentionCall, CallRecorder, attention_modules

__all__ = ["AnyModelCheck", "check_any_model", "check_sdpa_calls", "elsewhere",
           "implementation_label", "refused"]


class _Stopped(Exception):
    """Raised through the model after a call that raised was recorded."""


class _CheckFailed(Exception):
    """Judging a call failed: a gap in attnkit's check, never the model's fault."""


def judge_call(call: Any) -> Judged:
    """Judge one :class:`~.torch_calls.AttentionCall`."""
    if call.error is not None:
        return judge_raised(call)
    if call.kind == "sdpa":
        return judge_sdpa(call)
    if call.kind == "mha":
        return judge_mha(call)
    return any_flex.judge_flex(call)  # looked up per call: tests may replace it


def implementation_label(implementation: Any) -> str:
    """``"torch"`` (the model's own calls), the function's name, or ``"name in layers"``
    (a sentence of the catalogue, in the report's language)."""
    if implementation is None:
        return "torch"
    if callable(implementation):
        return getattr(implementation, "__qualname__", type(implementation).__name__)
    return join([T("model.fn-in-layers", fn=str(getattr(fn, "__qualname__", fn)),
                   layers=pattern) for pattern, fn in implementation.items()])


def _arguments(inputs: Any) -> tuple[tuple, dict]:
    """``(args, kwargs)`` to call the model with: a dict is keyword arguments, a tuple or
    list positional ones, anything else the one positional argument."""
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def _to_device(x: Any, device: Any) -> Any:
    """``x`` with every tensor (in tuples, lists and dicts too) on ``device``."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, dict):
        return {n: _to_device(v, device) for n, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_to_device(v, device) for v in x)
    return x


def _describe(inputs: Any) -> str:
    import torch

    args, kwargs = _arguments(inputs)
    parts = [f"{tuple(x.shape)} {str(x.dtype).replace('torch.', '')}"
             if isinstance(x, torch.Tensor) else type(x).__name__ for x in args]
    parts += [f"{n}={tuple(x.shape)}" if isinstance(x, torch.Tensor) else
              f"{n}={type(x).__name__}" for n, x in kwargs.items()]
    return T("any.inputs", parts=", ".join(parts)) if parts else T("any.no-inputs")


def _dtype_of(model: Any, inputs: Any) -> str:
    """The model's dtype: its first parameter's, or, for a model without weights (a
    function of its inputs), its first floating-point input's (``""``: none)."""
    import torch

    params = next(iter(model.parameters()), None)
    if params is not None:
        return str(params.dtype).replace("torch.", "")
    args, kwargs = _arguments(inputs)
    for x in [*args, *kwargs.values()]:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return str(x.dtype).replace("torch.", "")
    return ""


class _Run:
    """The one case of :class:`AnyModelCheck`, the model's forward: the rows by layer, the
    findings so far (the first of each code), the first failing call's reproducer (made by
    ``reproduce(run, (finding, call, judged))``)."""

    def __init__(self, result: ImplementationResult,
                 reproduce: Callable[[_Run, tuple], str]) -> None:
        self.result = result
        self.rows: dict[str, LayerRow] = {}
        self.reproduce = reproduce
        self.found: list[ModelFinding] = []
        self.stopped = ""  # the error of the call that raised
        self.judged = 0  # calls compared with the oracle (or found wrong)

    def row(self, layer: str) -> LayerRow:
        row = self.rows.get(layer)
        if row is None:
            row = self.rows[layer] = LayerRow(layer or "(model)")
            self.result.layers.append(row)
        return row

    def on_call(self, call: AttentionCall) -> None:
        row = self.row(call.layer)
        row.calls += 1
        try:
            judged = judge_call(call)
        except Exception as err:  # attnkit's own failure: say so, never blame the model
            raise _CheckFailed(f"{type(err).__name__}: {first_line(err)}") from err
        if call.mutated:
            self.find(row, call, judged, "mutates-input",
                      T("any.mutates", names=", ".join(call.mutated)))
        if judged.note and not judged.code:
            row.note = row.note or judged.note
        else:
            self.judged += 1
        row.empty_rows += judged.empty_rows
        if judged.bound and (row.bound == 0.0 or judged.error / judged.bound > row._ratio):
            row.worst_error, row.bound = judged.error, judged.bound
            row._ratio = judged.error / judged.bound
        if judged.code:
            self.find(row, call, judged, judged.code, judged.message)
        if call.error is not None:
            self.stopped = f"{type(call.error).__name__}: {first_line(call.error)}"
            if call.kind != "mha":  # a module hook cannot stop the forward: it is raising
                raise _Stopped(self.stopped)

    def overflowed(self, layer: str, message: Text, measured: str) -> None:
        """The forward raised in half precision only: ``float16-overflow`` at ``layer``."""
        row = self.row(layer)
        row.verdict = row.verdict if row.verdict != "ok" else "float16-overflow"
        self.result.first_failing_layer = self.result.first_failing_layer or row.layer
        self.found.append(ModelFinding("float16-overflow", message, measured,
                                       T("model.at-layer", layer=row.layer), "",
                                       self.result.name, None, row.layer))
        self.judged += 1

    def find(self, row: LayerRow, call: AttentionCall, judged: Any, code: str,
             message: str) -> None:
        at = judged.at if code == judged.code else {}
        places = [T(f"model.at-{n}", i=x) for n, x in at.items()]
        where = join([T("model.at-layer", layer=row.layer), T("any.at-call", i=call.index)]
                     + places, "list")
        # inside a model a top-left/bottom-right mix-up changes what it computes: an error,
        # as ModelFinding.severity has it
        error = CODES[code][0] == ERROR or code == "causal-alignment"
        if error and row.verdict == "ok":
            row.verdict = code
            row.first_failure = join(places, "list") if places else \
                T("any.at-call", i=call.index)
            if self.result.first_failing_layer is None:
                self.result.first_failing_layer = row.layer
        if any(f.code == code for f in self.found):
            return
        f = ModelFinding(code, message, judged.measured if code == judged.code else "",
                         where, "", self.result.name, None, row.layer, at.get("batch"),
                         at.get("head"), at.get("query"))
        if error and not self.result.reproducer and code != "mutates-input":
            f.reproducer = self.reproduce(self, (f, call, judged))
        self.found.append(f)


def refused(label: str, why: str, dtype: str = "", inputs: str = "") -> ModelReport:
    """A report of a check that did not run: one implementation, status ``refused: why``
    (one line that says what to do)."""
    report = ModelReport(label, dtype, inputs)
    report.implementations.append(ImplementationResult("torch",
                                                       status=T("model.refused", why=why)))
    return report


def _nothing_judged(label: str, result: ImplementationResult, missing: dict) -> Text:
    """Why a run judged no call, in one line that says what to do."""
    notes = [row.note for row in result.layers if row.calls and row.note]
    if notes:
        return T("any.none-judged", note=notes[0])
    if missing:
        return T("any.none-made", n=len(missing), name=next(iter(missing)),
                 why=next(iter(missing.values())))
    return T("any.no-attention", label=label)


class AnyModelCheck:
    """``check_any_model`` along the spine (:mod:`attnkit.check.core.spine`): prepare (the
    model and its inputs, refused in one line when they cannot be run; the report's
    header), cases (one: the model's forward), judge (the forward in eval mode without
    gradients, under :class:`~.torch_calls.CallRecorder`: each attention call judged as it
    happens and dropped), reproduce (:func:`~.any_repro.any_reproducer`), finish (every
    attention module a row, one no judged call came from "not checked" with why; a run
    that judged nothing says why).

    Args: as :func:`check_any_model` has them (``label`` given).
    """

    def __init__(self, model: Any, inputs: Any, implementation: Any,
                 save_to: str | Path | None, label: str) -> None:
        self.model, self.inputs, self.implementation = model, inputs, implementation
        self.save_to, self.label = save_to, label
        self.report = ModelReport(label)
        self.run: _Run | None = None
        self.recorder: CallRecorder | None = None
        self.t0 = 0.0

    def prepare(self) -> bool:
        import torch

        model, inputs, report = self.model, self.inputs, self.report
        if not isinstance(model, torch.nn.Module):
            return self._refuse(T("any.not-module", type=type(model).__name__))
        if inputs is None:
            return self._refuse(T("any.no-inputs-given", label=self.label))
        params = next(iter(model.parameters()), None)
        report.dtype = _dtype_of(model, inputs)
        report.inputs = T("any.one-forward", inputs=_describe(inputs))
        if params is not None:  # inputs read from a file sit on the CPU: the model's device
            self.inputs = _to_device(inputs, params.device)
        self.t0 = time.perf_counter()
        return True

    def _refuse(self, why: Text) -> bool:
        self.report.implementations.append(
            ImplementationResult("torch", status=T("model.refused", why=why)))
        return False

    def cases(self) -> list[_Run]:
        """One: the model's forward, under ``implementation``."""
        return [_Run(ImplementationResult(implementation_label(self.implementation)),
                     self.reproduce)]

    def judge(self, run: _Run) -> Iterator[ModelFinding]:
        """Run the model once, every attention call judged as it happens; the findings."""
        import torch

        model, result = self.model, run.result
        self.report.implementations.append(result)
        self.run = run
        args, kwargs = _arguments(self.inputs)
        training = model.training
        model.eval()
        self.recorder = CallRecorder(model, run.on_call, self.implementation)
        try:
            with torch.no_grad(), self.recorder:
                out = model(*args, **kwargs)
            if not any(f.code in ("float16-overflow", "nan-or-inf") for f in run.found):
                half = half_non_finite(model, args, kwargs, out, self.label)
                if half is not None:
                    run.overflowed(*half)
        except _CheckFailed as err:
            result.status = T("any.check-failed", error=str(err))
        except _Stopped as err:
            result.status = T("any.stopped", error=str(err))
        except Exception as err:  # the model itself did not run on these inputs
            half = None if run.stopped else half_raise(model, args, kwargs, err, self.label)
            if run.stopped:
                result.status = T("any.stopped", error=run.stopped)
            elif half is not None:
                run.overflowed(*half)
            else:
                result.status = T("model.refused", why=T(
                    "any.model-raised", label=self.label,
                    error=f"{type(err).__name__}: {first_line(err)}"))
        finally:
            model.train(training)
        yield from run.found

    def reproduce(self, run: _Run, verdict: tuple) -> str:
        """The reproducer of ``verdict``, ``(finding, call, judged)``: the call's inputs
        saved under ``save_to`` (a new temporary folder on the first), the file kept as
        the run's reproducer; the program, or why it could not be saved."""
        f, call, judged = verdict
        try:
            if self.save_to is None:  # one new folder per check, made when needed
                self.save_to = tempfile.mkdtemp(prefix="attnkit-check-")
            path, text = any_reproducer(Path(self.save_to), f, call, judged)
        except Exception as err:  # a reproducer must never hide the finding
            return T("any.no-reproducer", error=first_line(err))
        run.result.reproducer = str(path)
        return text

    def finish(self) -> None:
        """Every attention module of the model a row, in the model's order; a run that
        judged no call is refused, saying why."""
        run, recorder, model = self.run, self.recorder, self.model
        assert run is not None and recorder is not None
        result = run.result
        missing = not_checked(attention_modules(model), recorder.callers, recorder.ran,
                              **({"not_ran": T("any.not-ran-stopped")}
                                 if result.status != "ran" else {}))
        for name, why in missing.items():
            if name not in run.rows:  # a layer with a finding (raised in half) has its row
                result.layers.append(LayerRow(name, verdict=NOT_CHECKED, note=why))
        order = {name or "(model)": i for i, (name, _) in enumerate(model.named_modules())}
        result.layers.sort(key=lambda row: order.get(row.layer, len(order)))  # model's order
        if result.status == "ran" and not run.judged:
            result.status = T("model.refused", why=_nothing_judged(self.label, result, missing))
        self.report.seconds = time.perf_counter() - self.t0


def check_any_model(model: Any, inputs: Any, *, implementation: Any = None,
                    save_to: str | Path | None = None, label: str | None = None) -> ModelReport:
    """Run ``model`` once on ``inputs`` and judge every attention call it makes.

    Args:
        model: any ``torch.nn.Module``.
        inputs: what to call it with: a tensor, a tuple or list of positional arguments,
            or a dict of keyword arguments.
        implementation: None (judge the model's calls as they run), a function with the
            signature of ``F.scaled_dot_product_attention`` to run in place of every SDPA
            call, or ``{layer pattern: function}`` for some layers only (``fnmatch``
            patterns of module names, ``"blocks.1.attn"``, ``"blocks.*.attn"``).
        save_to: folder for the reproducers' ``.pt`` files (default: a temporary folder,
            made only when there is a finding).
        label: the model's name in the report (default: its class name).

    Returns:
        A :class:`~.report.ModelReport` with one implementation: a row per layer
        that made calls, then one per attention module not checked; ``ok`` is False when
        a finding is an error or nothing was judged (``status`` says why in one line).
    """
    label = label or type(model).__name__
    return follow(AnyModelCheck(model, inputs, implementation, save_to, label))


def check_sdpa_calls(model: Any, inputs: dict, implementation: Any,
                     save_to: str | Path | None = None, label: str | None = None) -> ModelReport:
    """A transformers model run once with ``attn_implementation="sdpa"`` (put back after),
    ``implementation`` in place of its SDPA calls, each call judged
    (:func:`check_any_model`)."""
    import warnings

    before = model.config._attn_implementation
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model.set_attn_implementation("sdpa")
        except (ValueError, ImportError, KeyError) as err:
            return refused(label or type(model).__name__,
                            T("any.refuses-sdpa", error=first_line(err)))
    try:
        return check_any_model(model, dict(inputs), implementation=implementation,
                               save_to=save_to, label=label)
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.set_attn_implementation(before)


def elsewhere(model: Any, inputs: Any, implementation: Any, implementations: Any,
              generate: int, sample: int | None, save_to: str | Path | None,
              random_inputs: dict) -> ModelReport | None:
    """The report of ``check_model`` when it is not the transformers check: any other
    ``nn.Module`` (judged call by call; the transformers-only arguments refused in one
    line), or ``implementation`` given (on a transformers model or path: run with sdpa,
    random inputs from ``random_inputs`` when ``inputs`` is None). None: the transformers
    check runs."""
    path = isinstance(model, (str, Path))
    transformers = path or (hasattr(model, "set_attn_implementation")
                            and hasattr(getattr(model, "config", None), "_attn_implementation"))
    if not transformers:
        if implementations is not None or generate or sample is not None:
            return refused(type(model).__name__, T("any.transformers-only"))
        return check_any_model(model, inputs, implementation=implementation, save_to=save_to)
    if implementation is None:
        return None
    from .load import check_inputs, load_model, make_inputs, require_transformers

    require_transformers()
    label = str(model) if path else None
    if path:
        model = load_model(str(model))
    if inputs is None:
        inputs = make_inputs(model, **random_inputs)
    check_inputs(model, inputs)
    return check_sdpa_calls(model, inputs, implementation, save_to, label)
