"""English: the sentences of a report and of the function checks."""

from __future__ import annotations

TEXTS: dict[str, str] = {
    # -- the frame of a report ------------------------------------------------------------
    "sep.list": ", ",
    "sep.clauses": "; ",
    "sep.fields": ", ",
    "error": "error",
    "warning": "warning",
    "report.title": "attnkit check {check}: {target}",
    "report.framework": "framework {value}",
    "report.convention": "convention {value}",
    "report.layout": "layout {value}",
    "report.not-found": "not found",
    "report.causality": "causality: {value}",
    "report.cases": "{n} cases in {seconds:.2f} s",
    "report.untested": "masks, empty rows and causal alignment were not tested: no mask "
                       "argument was recognised (declare one with --convention valid_lens, "
                       "masked, keep, sdpa or additive)",
    "report.untested-causal": "masks and empty rows were not tested: no mask argument was "
                              "recognised (declare one with --convention valid_lens, masked, "
                              "keep, sdpa or additive)",
    "report.no-findings": "no findings: every case agrees with the oracle",
    "report.severity": "severity",
    "report.code": "code",
    "report.diagnosis": "diagnosis",
    "report.detail": "detail",
    "report.measured": "measured",
    "report.case": "case",
    "report.see": "see",
    "report.reproducer": "reproducer for {code}:",
    "report.verdict": "{verdict}: {errors} error(s), {warnings} warning(s)",
    "report.ok": "OK",
    "report.failed": "FAILED",
}

# -- what was measured, against the 2x/3x/5x rule (core/oracle.py) -----------------------
TEXTS.update({
    "report.stopped": "the check stopped while running {running}: {error}",
    "measured.raised": "{name}",
    "measured.rule-shape": "{name}: shape {shape} != reference shape {want}",
    "measured.rule-nan": "{name}: {n} NaN where the reference has none",
    "measured.rule-finite": "{name}: {n} finite where the reference is NaN (NaN in an "
                            "attended position must propagate)",
    "measured.rule-inf": "{name}: {n} inf where the reference differs",
    "measured.rule": "{name}: max error {err:.3e} (mean {mean:.3e}) exceeds {factor} x "
                     "baseline {base:.3e} (mean {base_mean:.3e}) + {atol:g} = {bound:.3e}",
})
TEXTS.update({
    "measured.name-output": "output",
    "measured.name-softmax": "softmax",
    "measured.name-weights": "weights",
    "measured.name-attention-core": "attention core",
    "measured.name-inner-attention": "inner attention",
    "report.running-fn": "fn",
    "report.running-module": "the module",
})

# -- judging a function case by case (core/judge.py) ---------------------------------------
TEXTS.update({
    "judge.mutates": "fn writes into its argument {name} (an in-place op such as mul_, "
                     "masked_fill_ or x[...] = ...): the caller's {name} changes; work on a "
                     "copy or use the out-of-place op",
    "measured.differs-after": "{name} differs after the call",
    "judge.half-raises": "fn raises in {dtype} but not in float32 ({error}); {cause}",
    "judge.raises-on": "fn raises on {case} ({error})",
    "judge.not-an-array": "fn returned {type}, not an array or (out, weights): {error}",
    "judge.output-shape": "output shape {shape}, expected {want} on {case}",
    "measured.shape": "shape {shape} != {want}",
    "measured.non-finite": "{n} of {size} values non-finite in the output",
    "measured.non-finite-empty": "{n} of {size} values non-finite in rows with no allowed key",
    "judge.half-non-finite": "fn gives NaN/inf in {dtype} where float32 is finite: {cause}",
    "judge.one-maximum": "fn gives NaN/inf on rows whose logits are far below another row's: "
                         "it subtracts one maximum for the whole array (x.max()), not each "
                         "row's; subtract x.max(axis=-1, keepdims=True)",
    "judge.no-max-trick": "fn gives NaN/inf for finite inputs: a softmax without the max "
                          "trick overflows exp(); subtract the row maximum first",
    "judge.non-finite": "fn gives NaN/inf where the oracle is finite",
    "judge.empty-row-nan": "a query with no allowed key gives NaN (softmax of an all -inf "
                           "row): guard empty rows so they give 0",
    "judge.weights": "the returned weights disagree with the oracle's softmax (the output is "
                     "right)",
    "judge.row-uniform-additive": "a uniform row (an additive finfo.min mask, as "
                                  "transformers' eager attention takes, leaves every score "
                                  "of the row equal)",
    "judge.row-uniform": "a uniform row ({fill} leaves every score of the row equal)",
    "judge.row-other": "neither 0 nor NaN",
    "judge.empty-row": "a query with no allowed key gets {what}; attnkit, SDPA and flash-attn "
                       "give 0 (JAX and d2l a uniform row)",
    "measured.empty-rows": "max |out| {value:.3g} on rows that should be 0",
    "judge.wrong-not-imprecise": "fn's result is wrong, not just imprecise: off by up to "
                                 "{worst:.2g} where the rule allows {bound:.1g} (2x the error "
                                 "of plain {dtype} math); check the formula on this case (the "
                                 "reproducer prints both)",
    "judge.wrong-not-imprecise-half": "fn's result in {dtype} is wrong, not just imprecise: "
                                      "off by up to {worst:.2g} where the rule allows "
                                      "{bound:.1g} (2x the error of plain {dtype} math); check "
                                      "the formula on this case (the reproducer prints both)",
    "judge.beyond-rule": "fn's result is further from the oracle than 2x the error of plain "
                         "{dtype} math",
    "judge.beyond-rule-half": "fn's result in {dtype} is further from the oracle than 2x the "
                              "error of plain {dtype} math",
    "judge.leak-no-mask": "declared causal, the function lets a query see later keys: its "
                          "output is that of attention with no causal mask (apply the causal "
                          "mask, keys j <= i + Tk - Tq)",
    "judge.causal-here": "fn masks the future on these inputs (query i sees keys "
                         "j <= i + Tk - Tq) but not on others: if it is meant to be causal, "
                         "make it causal on every input and pass causal=True (--causal)",
    "judge.top-left": "is_causal is aligned top-left (query i sees keys j <= i), as PyTorch "
                      "SDPA and JAX; attnkit and flash-attn align it bottom-right "
                      "(j <= i + Tk - Tq): for Tq != Tk pass the mask you mean",
    "judge.leak-moved": "declared causal, the function lets a query see later keys: changing "
                        "only the keys and values after query {query}'s position "
                        "(j > {query} + Tk - Tq) changes its output (keep keys "
                        "j <= i + Tk - Tq, bottom-right)",
    "scale.none": "not scaled (1/sqrt(Dk) is missing)",
    "scale.over-dk": "scaled by 1/Dk instead of 1/sqrt(Dk)",
    "scale.times-sqrt-dk": "multiplied by sqrt(Dk) instead of divided",
    "scale.over-sqrt-dv": "scaled by 1/sqrt(Dv), the value head dim",
    "scale.default": "scaled by 1/sqrt(Dk) instead of the scale asked for",
    "judge.scale": "the scores are {scaled}; scaled dot-product attention uses 1/sqrt(Dk) = "
                   "{default:.4g}",
    "judge.axis": "fn normalises over axis {axis}, not the last axis: each row of the last "
                  "axis must sum to 1",
    "polarity.masked": "True = masked out",
    "polarity.keep": "True = may attend",
    "polarity.sdpa": "bool attn_mask: True = may attend",
    "judge.polarity": "fn reads the mask the other way round from the '{convention}' "
                      "convention ({meaning}): it attends exactly the keys the mask excludes",
    "judge.no-grad-fn": "fn's output is not differentiable (no grad_fn): it leaves autograd "
                        "(NumPy, .detach(), .item()) or builds a new tensor",
    "measured.no-grad-fn": "no grad_fn",
    "judge.backward-raises": "backward raises ({error})",
    "judge.input-no-grad": "{name} gets no gradient",
    "measured.grad-none": "grad is None",
    "judge.grad-disagrees": "the gradient with respect to {name} disagrees with the oracle's "
                            "(a custom backward?)",
})

# -- the cases (core/cases.py) ----------------------------------------------------------
TEXTS.update({
    "case.label": "{name}: {details}",
    "case.basic": "basic",
    "case.masked": "masked",
    "case.fully-masked-row": "fully masked row",
    "case.per-query-lengths": "per-query lengths",
    "case.a-query-with-none": "a query with none",
    "case.causal": "causal",
    "case.4-D": "4-D",
    "case.probe": "probe",
    "case.head-dim": "head dim {n}",
    "case.length": "length {n}",
    "case.logits": "logits {n}",
    "case.mask": "mask {kind}",
    "case.mask-per-key": "mask {kind} per key",
    "case.mask-lens-2d": "valid_lens (B, Tq), one length per query",
    "case.mask-lens-2d-empty": "valid_lens (B, Tq), query 0 of row 0 with length 0",
    "case.logits-spread": "logits ~{x} in query 0's row, ~0 in the others",
    "case.rows-of-different-scale": "rows of different scale",
    "case.logits-near": "logits ~{x}",
})

# -- building and loading what the user named (meet/) -------------------------------------
TEXTS.update({
    "origin.cell": "defined in cell {number} of {file}",
    "build.hint-factory": "write a factory and check it instead: def make(E, H): return "
                          "{call}, then attnkit check multi-head {where}:make",
    "build.hint-instance": "pass an instance or a function instead: layer = {name}(...) at "
                           "the top of the file, then attnkit check ... {where}:layer",
    "build.no-signature": "the signature of {name} cannot be read ({error}); {hint}",
    "build.no-config": "{signature} takes a config object ({name}) and no config class was "
                       "found (annotate it, or keep a dataclass with the width and head count "
                       "in the same file); {hint}",
    "build.a-function": "{signature} takes the inputs themselves: it is an attention "
                        "function, not a module or its factory; check it with attnkit check "
                        "attention (or masked-softmax, softmax)",
    "build.a-module": "{signature} takes a width and a head count: it looks like a multi-head "
                      "attention module; check it with attnkit check multi-head "
                      "(check_multi_head), which builds it from those names",
    "build.no-rule": "cannot build {signature}: no rule for the required parameter(s) "
                     "{names}; {hint}",
    "build.built-as": "built as {expr}",
    "build.instance-wide": "the instance is {width} wide",
    "build.instance-no-copy": "the instance cannot be copied: {error}",
    "build.as-loaded": "the instance {name}, as loaded",
    "build.fresh": "built as {expr}, a fresh one of the instance's class (the check runs at "
                   "width {width}; {reason})",
})

# -- calling a function, and the header of its report (function/) -------------------------
TEXTS.update({
    "try.layout-per-key": "{fw} {layout}, mask (B, Tk)",
    "try.raised": "{label}: {error}",
    "try.returned": "{label}: returned {type}",
    "try.output-shape": "{label}: output shape {shape}, expected {want}",
    "call.layouts-attention": "NumPy arrays and PyTorch tensors, (B, H, T, D), (B, T, D) and "
                              "(B, T, H, D)",
    "call.layouts": "NumPy arrays and PyTorch tensors",
    "call.fix": "the check calls it as {args}: take the inputs positionally or by the names "
                "query/key/value, declare the mask with --convention, or wrap it: "
                "def fn(q, k, v): return mine(...)",
    "call.fix-unfilled": "it needs {names}, which the check cannot fill: wrap it, e.g. "
                         "lambda q, k, v: fn(q, k, v, {first}=...); {fix}",
    "call.fix-instance": "pass an instance, or a function that calls it; {fix}",
    "call.no-output": "no output",
    "call.failed": "fn could not be called with {layouts}: {first}; {fix}",
    "measured.tried": "{n} call(s) tried: {tries}",
    "call.nondeterministic": "two identical calls give different outputs: dropout is on: call "
                             "`.eval()` or pass dropout 0 (F.dropout's training argument "
                             "defaults to True: pass training=self.training)",
    "call.nondeterministic-train": "two identical calls give different outputs: dropout is "
                                   "on: call `.eval()` or pass dropout 0 (fn is a module left "
                                   "in train mode)",
    "measured.differ-by": "two identical calls differ by up to {value:.3g}",
    "measured.differ-in-shape": "two identical calls differ in shape",
    "call.not-callable": "{target} is a {type} object, not something to call: name a "
                         "function, an instance or a class",
    "measured.not-callable": "not callable",
    "call.class-not-built": "{name} is a class and the check needs something to call: {why}",
    "measured.not-built": "not built",
    "call.class-raised": "{name} is a class; building it raised {error}; pass an instance or "
                         "a function instead",
    "call.no-layout": "fn could not be called with any input layout: {tries}",
    "call.shape-error": "fn raises a shape error on every input layout tried ({first}): an "
                        "axis that should be kept (keepdims) or a transpose is missing",
    "call.per-query-lens": "fn handles valid_lens (B,) but not d2l's per-query lengths "
                           "(B, Tq) (query i of row b sees keys j < valid_lens[b, i]): "
                           "{message}; turn (B,) into (B, Tq) first, then compare "
                           "np.arange(Tk) < valid_lens[..., None]",
    "header.stand-in": "a stand-in (training=False, num_key_value_groups=1)",
    "header.convention": "{name} ({how})",
    "how.declared": "declared",
    "how.from the signature": "from the signature",
    "how.from behaviour": "from behaviour",
    "how.assumed": "assumed",
    "header.passed-as": ", passed as {name}=",
    "header.passed-as-keys": ", passed as {name}= (B, Tk)",
    "header.the-mask": "the mask",
    "header.per-key": ", {name} (B, Tk): one flag per key",
    "header.flags": "; {names} left at default (not a mask)",
    "header.fixed": "; {values}",
    "header.value": "{name}={value}",
    "header.layout-bthd": "(B, T, H, D) in and out, heads on axis 2 as JAX and flash-attn "
                          "take them (transposed to judge it)",
    "header.output-bthd": ", output (B, Tq, H, Dv) (transposed back to judge it)",
    "header.declared-causal": "declared causal: judged against bottom-right causal attention",
    "header.behaves-causal-judged": "behaves as causal (judged as causal; pass --causal to "
                                    "declare it)",
    "header.attends-every-key": "; attends every key (judged so) on: {names}",
})

# -- loading a target (meet/targets.py, the command) ---------------------------------------
TEXTS.update({
    "load.import": "importing {where} raised {error}",
    "load.cell": "cell {number} of {file} raised {type} before {name} was defined: {line}",
    "load.failed": "{error}; fix it, or point TARGET at a file that runs on its own",
    "measured.not-loaded": "not loaded",
})

# -- why half precision fails (core/overflow.py) -----------------------------------------
TEXTS.update({
    "overflow.helper": "a dtype helper or table has no entry for {dtype} (it raises on it): "
                       "derive the value from the dtype, e.g. torch.finfo(dtype).min",
    "overflow.attribute": "{attr} is a plain float32 tensor attribute, which .half() and .to() "
                          "do not convert (they convert parameters and buffers): register it "
                          "with self.register_buffer({name}, ...)",
    "overflow.constant": "the constant {constant} ({line}) does not fit in float16, whose "
                         "largest value is 65504: fill with -inf or torch.finfo(dtype).min and "
                         "guard empty rows",
    "overflow.range": "a value overflows {dtype}'s range or precision (exp, a sum of squares, "
                      "a product of scores): keep the softmax's statistics in float32",
    "overflow.setting": "{attr} = {value} does not fit in float16, whose largest value is "
                        "65504: fill with -inf or torch.finfo(dtype).min and guard empty rows",
    "overflow.unread": "a value leaves {dtype}'s range, in code the check cannot read (the "
                       "library's own functions, or code with no source file): a fill or "
                       "bias constant too large for {dtype}, exp of large scores, or a sum of "
                       "squares; fill with torch.finfo(dtype).min (or -inf, guarding empty "
                       "rows) and keep the softmax's statistics in float32",
    "overflow.mixed": "a tensor made in forward stays float32 (torch.arange, torch.zeros, "
                      "cos/sin tables made without dtype=) and meets the {dtype} values, "
                      "so the call refuses the mixed dtypes: make it with dtype=x.dtype or "
                      "cast it with .to(x.dtype)",
    "overflow.fill": "a large negative fill",
    "overflow.fill-here": "a large negative fill ({value} here)",
    "overflow.nan-in-output": "NaN/inf in the output",
})
TEXTS.update({
    "header.default-raises": "; {name}=None raises ({error}), so every case passes a mask "
                             "(one that masks nothing where it has none)",
    "header.one-sequence": "fn takes one sequence (2-D inputs): called once per batch row and "
                           "head, outputs stacked",
    "header.one-sequence-after": "; fn takes one sequence (2-D inputs): called once per batch "
                                 "row and head, outputs stacked",
    "call.one-sequence": "fn takes one sequence, not a batch: on batched inputs it raises "
                         "{error}; it was checked once per batch row and head. If it should "
                         "take a batch, swap only the last two axes (np.swapaxes(k, -1, -2) or "
                         "k.transpose(-1, -2), not k.T) and reduce over axis -1",
    "case.batched-inputs": "batched inputs",
    "build.why-no-rule": "no rule for the required parameter(s) {names}",
    "build.config-fields": "cannot build {signature}: its {name} ({cls}) has fields the check "
                           "cannot guess ({why}); write the factory and check it: "
                           "def make(E, H): return {factory}, then attnkit check {kind} "
                           "{where}:make",
})

# -- usage errors: a convention that does not fit the function (a UsageError, said by the CLI)
TEXTS.update({
    "fn.convention-choices": "convention must be one of {choices}, got {got}",
    "fn.softmax-no-mask": "check_softmax takes no mask: convention must be 'auto' or 'none', "
                          "got {got}",
    "fn.masked-no-mask": "check_masked_softmax: fn takes no mask argument; pass "
                         "convention='valid_lens', 'masked', 'keep' or 'additive'",
    "fn.causal-sdpa": "causal=True declares a function that masks the future itself; the sdpa "
                      "convention passes is_causal=True in its causal cases already",
    "fn.per-query-lens": "per_query_lens=True passes d2l's valid_lens (B, Tq), but fn's mask "
                         "argument reads as {conv}: pass convention='valid_lens' if it takes "
                         "lengths",
})
