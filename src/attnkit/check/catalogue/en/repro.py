"""English: the comments and printed labels of the model check's reproducers
(model/repro.py, model/any_repro.py). The code around them is the same in every language;
what a learner reads in it (a comment, what a line prints, an assertion's message) is a
sentence, and follows the report's language."""

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
