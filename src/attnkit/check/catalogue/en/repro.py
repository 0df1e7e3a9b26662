"""English: the comments, printed labels and assertion messages of the reproducers (the
model check's: model/repro.py, model/any_repro.py; the function and multi-head checks':
core/repro.py, core/cases.py, meet/calls.py, function/, multihead/). The code around them is
the same in every language; what a learner reads in it (a comment, what a line prints, an
assertion's message) is a sentence, and follows the report's language."""

from __future__ import annotations

TEXTS: dict[str, str] = {
    "sep.line": "\n",
    "repro.stand-in": "what fn reads off the calling module",
    "repro.module-state": "its settings and own tensors (sinks)",
    "repro.raises-half": "raises in half precision",
    "repro.raises": "raises ({error})",
    "repro.oracle-received": "float64 oracle, on what fn received",
    "repro.row-error": "max error of that row against the oracle:",
    "repro.register-first": "register your function first",
    "repro.as-ran": "as the model ran it",
    "repro.pair": "batch row {batch}, query i, key j",
    "repro.pair-head": "batch row {batch}, head {head}, query i, key j",
    "repro.received-allows": "what the call's mask allows",
    "repro.expected-allows": "what config and padding allow",
    "repro.may-see": "query i may see key j: received",
    "repro.expected": "| expected",
    "repro.quoted": "{text!r}",
    "repro.define-here": "{name}: the implementation under test (no file names it; define it "
                         "here)",
    "repro.under-test": "the implementation under test",
    "repro.output-shape": "output shape",
    "repro.build-yours": "build your {name} as the model does",
    "repro.own-settings": "its own settings, as in the model",
    "repro.from-weights": "float64, from the module's weights",
    "repro.flex-code": "the layer's score_mod and block_mask are functions of your code "
                       "({layer}):",
    "repro.flex-off": "row batch {batch}, head {head}, query {query} is off by more than "
                      "{bound}",
}

# -- the function and multi-head checks' reproducers (core/repro.py, core/cases.py,
# meet/calls.py, function/, multihead/) ----------------------------------------------------
TEXTS.update({
    # the inputs (core/cases.py)
    "repro.per-query-lens": "per query: query i of row b sees keys j < valid_lens[b, i]",
    "repro.lens": "keys j < {lens}[b] count",
    "repro.may-attend-per-key": "True = may attend, per key",
    "repro.batch-keeps": "each batch keeps a key, drops one",
    "repro.batch0-no-key": "batch 0 may attend no key",
    "repro.every-query": "the same for every query",
    "repro.may-attend": "True = may attend",
    "repro.masked": "True = masked",
    "repro.additive": "additive: 0 = may attend",
    "repro.row-keeps": "each row keeps a key, drops one",
    "repro.query0-no-key": "query 0 may attend no key",
    "repro.bottom-right": "bottom-right causal",
    "repro.every-score": "every score is {logit} + O(1)",
    "repro.but-query0": "but query 0's: the other rows' scores are O(1)",
    "repro.row0-near": "row 0 near {logit}, the other rows near 0",
    # calling the function (meet/calls.py, function/)
    "repro.fn-notebook": "the function you checked, defined in your notebook",
    "repro.fn-named": "{name}: your function here",
    "repro.fn-here": "your function here",
    "repro.fn-returns": "fn returns (B, Tq, H, Dv)",
    "repro.raises-name": "raises {error}",
    "repro.not-array": "fn returned {type}, not an array",
    "repro.one-sequence": "one() takes one sequence (2-D inputs): call it per batch row and "
                          "head, then stack.",
    "repro.row-of": "an input or mask with the batch (and head) axes: its i-th sequence",
    # against the oracle (core/repro.py)
    "repro.oracle": "the float64 oracle",
    "repro.oracle-grad": "the float64 oracle's gradient",
    "repro.softmax-backward": "softmax backward",
    "repro.grad-error": "max error of d{name}:",
    "repro.wrote-into": "fn wrote into its argument(s) {changed}",
    "repro.shape": "shape {got} != {want}",
    "repro.no-allowed-key": "rows with no allowed key",
    "repro.max-error": "max error against the oracle:",
    "repro.small-enough": "small enough to read: where they differ",
    "repro.label-fn": "fn:    ",
    "repro.label-oracle": "oracle:",
    "repro.error-scale": "error with scale={scale}:",
    "repro.error-inverted": "error with the mask inverted:",
    "repro.error-no-causal": "error against attention with no causal mask:",
    "repro.error-top-left": "error against top-left causal:",
    "repro.two-calls": "largest difference of two identical calls:",
    # a multi-head module (multihead/)
    "repro.make-mask": "from mask (B, Tq, Tk), True = may attend, make the mask it asserts",
    "repro.factory-checked": "the class or factory you checked",
    "repro.factory-named": "{name}: your module's class or factory",
    "repro.dropout-off": "dropout off, as in the check",
    "repro.mask-required": "forward's mask is required: one that masks nothing",
    "repro.causal-flag": "the module's own causal flag: on, as it is declared causal",
    "repro.per-key": "per key: the same for every query",
    "repro.nothing-masked": "nothing masked",
    "repro.wrote-input": "the module wrote into its input",
    "repro.not-registered": "m.{name} is not a registered parameter",
    "repro.nan-from-finite": "NaN/inf from finite inputs",
    "repro.keys-masked": "keys {a} and {b} are masked",
    "repro.change-masked": "change only the masked keys",
    "repro.change-later": "change only the later positions",
    "repro.change-last": "change only the last query",
    "repro.example0-keys": "example 0 may attend keys 0 and 1",
    "repro.example1-keys": "example 1 keys 0..3",
    "repro.example0-masks": "keys example 0 masks",
    "repro.example1-masks": "the key example 1 masks",
    "repro.as-if-trained": "as if trained",
    "repro.half-non-finite": "NaN/inf in {dtype} where float32 is finite",
    "repro.example0-moved": "example 0's output moved when only example 1 changed",
    "repro.mixes-queries": "changing one query changed other queries' outputs: heads "
                           "split/merged without transpose(1, 2)",
    "repro.core-reads": "the module's core: what its output projection reads",
    "repro.core-off": "attention core off by {err}",
    "repro.core-differs": "the attention core differs from softmax(q k^T / sqrt(d)) v on the "
                          "q, k, v its own projections produced",
    "repro.one-value": "one value token, repeated at every position",
    "repro.values-from-key": "the output moved with key while every value token is the same: "
                             "the values are projected from key, not value",
    "repro.keys-from-value": "the output did not move when key changed: the keys are "
                             "projected from value, not key",
    "repro.permuted": "the same tokens in another order",
    "repro.split-no-transpose": "permuting the tokens did not permute the outputs: heads "
                                "split or merged without transpose(1, 2)",
})
