"""English: the command line of ``attnkit check`` and ``attnkit check model`` (attnkit/cli.py,
model/command.py, check/command_words.py): help, argparse's own words, usage errors."""

from __future__ import annotations

TEXTS: dict[str, str] = {}

# -- argparse's own words, and the one-line error -------------------------------------------
TEXTS.update({
    "cli.usage": "usage: ",
    "cli.positionals": "positional arguments",
    "cli.options": "options",
    "cli.help": "show this help message and exit",
    "cli.error": "{prog}: error: {message} (see: {prog} --help)",
    "cli.required": "the following arguments are required: {names}",
    "cli.invalid-choice": "argument {name}: invalid choice: {value} (choose from {choices})",
    "cli.unrecognized": "unrecognized arguments: {args}",
    "cli.expected-one": "argument {name}: expected one argument",
    "cli.expected-int": "argument {name}: expected an integer >= {low}, got {value}",
    "cli.expected-number": "argument {name}: expected a positive number, got {value}",
    "cli.argument": "argument {name}: {message}",
    "cli.causal-kind": "--causal applies to attention and multi-head, not {kind}",
    "cli.per-query-kind": "--per-query-lens applies to masked-softmax and attention, not {kind}",
    "target.spec": "expected FILE.py:NAME, NOTEBOOK.ipynb:NAME or package.module:NAME, got "
                   "{spec}",
    "target.no-attribute": "{spec}: {where} has no attribute {name}",
    "target.no-file": "{where}: no such file",
    "target.not-python": "{where}: cannot be imported as Python",
    "target.not-notebook": "{path}: not a Jupyter notebook ({error})",
    "target.no-cell": "{where}: no code cell defines {name}",
    "cli.target": "TARGET {target}: {error}",
    "cli.missing": "{user} needs {module}, which is not installed: {install}",
    "cli.error-only": "{prog}: error: {message}",
})

# -- attnkit check --help (attnkit/cli.py) ---------------------------------------------------
TEXTS.update({
    "help.check": "test your softmax/attention/multi-head attention against the oracle",
    "help.check.description": "Judge a NumPy or PyTorch implementation against attnkit's "
                              "float64 oracle on the inputs that break attention (odd head "
                              "dims, Tq != Tk, logits ~1e4, fully masked rows, half "
                              "precision) and print each finding: a stable code, a diagnosis "
                              "in words, the measured error and a reproducer. Exit status 1 "
                              "when any finding is an error. See docs/check.md.",
    "help.check.kind": "what TARGET is (multi-head: a class, built from its constructor's "
                       "parameter names, or a factory: TARGET(embed_dim, num_heads))",
    "help.check.target": "path/to/file.py:name, notes.ipynb:name or package.module:name (a "
                         "function, an instance, a bound method such as file.py:layer.forward, "
                         "a class or a factory)",
    "help.check.convention": "the mask argument: valid_lens (d2l), masked (True = masked), keep "
                             "(True = may attend), sdpa (attn_mask=, is_causal=), additive (a "
                             "float mask added to the scores: 0 or finfo.min), none (default: "
                             "auto, from the signature and behaviour)",
    "help.check.causal": "TARGET is meant to be causal (attention, multi-head): a query that "
                         "sees later positions is the error causal-leak",
    "help.check.per-query-lens": "with valid_lens (masked-softmax, attention): also pass d2l's "
                                 "per-query lengths (B, Tq), not only (B,)",
    "help.json": "print the report as JSON",
    "help.lang": "the language of the report and of this help: en or zh (中文); codes are the "
                 "same in both (default: $ATTNKIT_LANG, else en)",
    "help.check.epilog": "{usage}: every attention call of a model, a transformers model or "
                         "any PyTorch model as FILE.py:NAME (see: {help})",
})

# -- attnkit check model --help (model/command.py) -------------------------------------------
TEXTS.update({
    "help.model.description": "Run a transformers model under each attention implementation "
                              "(any PyTorch model given as FILE.py:NAME as it is) and judge "
                              "every attention call (prefill and, with --generate, each "
                              "decoding step) against attnkit's float64 oracle on what "
                              "it received, compare the mask it received with the one the "
                              "config and padding call for, and show per layer where "
                              "implementations part. Nothing is downloaded and no model code "
                              "is run (no trust_remote_code). Exit status 1 when any finding "
                              "is an error. See docs/check.md.",
    "help.model.model": "a local model folder (from_pretrained), a config.json (random "
                        "weights), or any PyTorch model as FILE.py:NAME (an nn.Module, or a "
                        "function or class that builds one with no arguments, or returns "
                        "(module, inputs)): its SDPA, flex_attention and nn.MultiheadAttention "
                        "calls are judged",
    "help.model.tiny": "instead of MODEL: a small random model of this family",
    "help.model.implementations": "comma-separated attn_implementation names; differences are "
                                  "measured against the first (default: %(default)s)",
    "help.model.dtype": "the model's dtype (default: float32; a FILE.py model keeps its own)",
    "help.model.implementation": "your attention function, with the signature of "
                                 "F.scaled_dot_product_attention: it runs in place of the "
                                 "model's SDPA calls and each call is judged (a transformers "
                                 "model is switched to sdpa for it)",
    "help.model.layers": "with --implementation: only in these layers (comma-separated module "
                         "names or fnmatch patterns, e.g. blocks.1.attn or 'blocks.*.attn')",
    "help.model.inputs": "the inputs, from a .pt (torch.load(weights_only=True): a tensor, a "
                         "tuple, or a dict of keyword arguments) or .safetensors file; no code "
                         "in it runs. Required for a FILE.py model that gives none",
    "help.model.seed": "seeds the random weights and inputs (default: %(default)s)",
    "help.model.padding": "padding of the random inputs (default: %(default)s)",
    "help.model.batch": "B of the random inputs (default: 2)",
    "help.model.length": "T of the random inputs (default: 12)",
    "help.model.generate": "decoding steps with a KV cache after the prefill (default: 0)",
    "help.model.generate-api": "with --generate, also run the model's own generate() with a "
                               "dynamic and a static cache, every attention call judged",
    "help.model.sample": "judge at most N heads and N queries per call against the oracle "
                         "(large models)",
    "help.model.save": "folder for the reproducers' .pt files (default: a temporary folder)",
})
