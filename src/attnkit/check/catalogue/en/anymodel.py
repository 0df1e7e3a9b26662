"""English: the sentences of ``check_model`` on any PyTorch model (model/any_*.py,
torch_calls.py, accounting.py, any_command.py)."""

from __future__ import annotations

TEXTS: dict[str, str] = {}

# -- the run and its report (model/any_model.py, accounting.py) ------------------------------
TEXTS.update({
    "any.one-forward": "{inputs}, one forward",
    "any.inputs": "inputs {parts}",
    "any.no-inputs": "no inputs",
    "any.at-call": "call {i}",
    "any.mutates": "the attention function writes into its argument(s) {names} (an in-place "
                   "op)",
    "any.no-reproducer": "# the reproducer could not be saved: {error}",
    "any.none-judged": "no attention call could be judged: {note}",
    "any.none-made": "no attention call was made: {n} module(s) look like attention "
                     "({name}: {why})",
    "any.no-attention": "{label} made no call of scaled_dot_product_attention, flex_attention "
                        "or nn.MultiheadAttention and has no attention module: nothing to "
                        "check",
    "any.not-module": "a {type} is not a torch.nn.Module: pass a model, a local model folder "
                      "or a FILE.py:build_model",
    "any.no-inputs-given": "{label} is not a transformers model and no inputs were given: "
                           "pass inputs (a tensor, a tuple of them or a dict of keyword "
                           "arguments), or --inputs FILE.pt",
    "any.check-failed": "not judged: attnkit's check failed ({error}); please report it",
    "any.stopped": "stopped: an attention call raised {error}; the layers after it did not "
                   "run",
    "any.model-raised": "{label} raised {error} (do the inputs fit its forward?)",
    "any.half-forward-nan": "{label} returns NaN/inf in {dtype} where the same forward in "
                            "float32 is finite: {cause}",
    "any.half-forward": "{label} raises in {dtype} where the same forward in float32 runs "
                        "({error}): {cause}",
    "any.not-ran": "it did not run on these inputs",
    "any.not-ran-stopped": "the run stopped before it (an attention call raised)",
    "any.stopped-before": "the run stopped before it",
    "any.no-interface": "no call of it reached transformers' AttentionInterface (its forward "
                        "computes attention itself, or it did not run on these inputs)",
    "any.inline": "it ran but made no call of torch.nn.functional.scaled_dot_product_attention, "
                  "flex_attention or nn.MultiheadAttention: attention computed inline cannot "
                  "be judged on what it received (call F.scaled_dot_product_attention, or pass "
                  "the function as --implementation)",
    "any.named-like": "named like attention",
    "any.refuses-sdpa": "--implementation replaces SDPA calls, and this model refuses sdpa: "
                        "{error}",
    "any.transformers-only": "implementations=, generate= and sample= apply to transformers "
                             "models; this one runs its own forward once, every call judged "
                             "whole: pass implementation=fn to judge your attention function",
    "any.bad-implementation": "implementation must be a function or a mapping of layer "
                              "patterns to functions, got {type}",
    "any.forward-raised": "{name}.forward raised",
})

# -- judging one call (model/any_judge.py, any_mha.py, any_flex.py) --------------------------
TEXTS.update({
    "any.dropout": "dropout_p={p} (random by design): call the model in eval mode with "
                   "dropout_p=0.0 there",
    "any.sdpa-shape": "the attention function returned {shape}; SDPA returns {want} (query's "
                      "shape with value's last dim)",
    "any.mask-ignored": "the function ignores the attn_mask it receives (masked keys get "
                        "weight)",
    "any.top-left": "is_causal with Tq = {Tq} != Tk = {Tk} aligned bottom-right; SDPA's "
                    "is_causal is top-left (query i sees keys j <= i)",
    "any.all-masked": "every query's keys are masked: nothing to compare with the oracle",
    "any.half": "NaN/inf in {dtype} where the same call in float32 is finite: {cause}",
    "any.half-raised": "the call raises in {dtype} where the same call in float32 runs "
                       "({error}): {cause}",
    "any.raised": "the attention call raised {error} (query {shape}, {dtype})",
    "any.mha-shape": "nn.MultiheadAttention returned {shape}; its query {query} calls for "
                     "(N, L, E) = {want}",
    "any.flex-grid": "a flex_attention call whose score_mod/mask_mod does not evaluate on a "
                     "(batch, head, query, key) grid ({error}): not compared with the oracle",
    "any.flex-shape": "a flex_attention call with an output of another shape than "
                      "(B, H, L, Ev): not compared with the oracle",
})

# -- attnkit check model FILE.py:NAME (model/any_command.py, model/command.py) ----------------
TEXTS.update({
    "cmd.load": "{what} {spec}: {error}",
    "cmd.import-raised": "{what} {spec}: its file raised while it was imported: {error}",
    "cmd.not-callable": "MODEL {spec} is a {type}: name an nn.Module, or a function or class "
                        "that builds one with no arguments",
    "cmd.factory-raised": "MODEL {spec}: calling it with no arguments raised {error}",
    "cmd.not-module": "MODEL {spec} gave a {type}, not an nn.Module (or a (module, inputs) "
                      "pair)",
    "cmd.not-function": "--implementation {spec} is a {type}, not a function with the "
                        "signature of F.scaled_dot_product_attention",
    "cmd.suffix": "--inputs {path} must be a .pt or .safetensors file (saved with torch.save "
                  "or safetensors.torch.save_file)",
    "cmd.no-file": "--inputs {path}: no such file",
    "cmd.safetensors": "--inputs {path}: reading .safetensors needs `pip install safetensors`",
    "cmd.unreadable": "--inputs {path} does not read with torch.load(weights_only=True) / "
                      "safetensors (tensors and plain containers only, no code): {error}",
    "cmd.transformers-only": "--generate, --sample and --implementations apply to "
                             "transformers models; a FILE.py model runs its own forward once "
                             "(use --implementation FILE.py:FN for your attention function)",
    "cmd.no-inputs": "MODEL {spec} gives no inputs: pass --inputs FILE.pt (or .safetensors), "
                     "or return (model, inputs) from {model}",
})
