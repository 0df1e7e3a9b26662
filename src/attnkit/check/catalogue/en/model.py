"""English: the sentences of the model checks."""

from __future__ import annotations

TEXTS: dict[str, str] = {}

# -- the report of a model check (model/report.py) ------------------------------------------
TEXTS.update({
    "model.title": "attnkit check model: {model}",
    "model.inputs": "{dtype}, {inputs}; {seconds:.1f} s",
    "model.ran": "ran",
    "model.masks": "; masks: ",
    "model.not checked": "  warning  not checked: no attention call of this implementation "
                         "was judged",
    "model.layer": "layer",
    "model.calls": "calls",
    "model.worst": "worst error / rule",
    "model.first failure": "first failure",
    "model.empty rows": "empty rows",
    "model.verdict": "verdict",
    "model.vs": "vs {first}: attention / hidden",
    "model.hidden": "hidden states vs {first}: largest difference {diff:.1e} at {name}",
    "model.first failing": "first layer whose own attention fails: {layer}",
    "model.at": "at",
    "model.reproducer": "reproducer ({code}, inputs in {path}):",
    "model.nothing judged": "no attention call was judged: this is not a pass",
    "model.made here": "made here",
    "model.inherited": "inherited",
    # the table's cells that are words: a layer's verdict (else a code), what empty rows hold
    "model.fn-in-layers": "{fn} in {layers}",
    "model.row.ok": "ok",
    "model.row.not checked": "not checked",
    "model.hold.uniform": "uniform",
    "model.hold.other": "other",
})
TEXTS.update({
    "model.note": "{name} was not checked ({calls} call(s) judged): {status}",
    "model.no-eager": "{module} defines no eager_attention_forward",
    "model.refused": "refused: {why}",
    "model.no-interface": "this model's attention does not go through transformers' "
                          "AttentionInterface",
    "model.check-failed": "not judged: attnkit's check failed at step {step} ({error}); please "
                          "report it",
    "model.stopped": "stopped at step {step}: {error} (the layers after it did not run)",
    "model.layer-step": "{layer} (step {step})",
    "model.at-prefill": "step {step} (prefill)",
    "model.at-decoding": "step {step} (decoding)",
    "model.at-path": "step {step} ({path})",
    "model.described-tensors": "{tensors}, random",
    "model.at-layer": "layer {layer}",
    "model.at-batch": "batch {i}",
    "model.at-head": "head {i}",
    "model.at-query": "query {i}",
    "model.at-key": "key {i}",
    "model.described": "batch {batch}, length {length}, {padding}",
    "model.padding-left": "padding left",
    "model.padding-right": "padding right",
    "model.padding-none": "padding none",
    "model.described-given": "batch {batch}, length {length}, the caller's inputs",
    "model.decoding": ", {n} decoding step(s)",
    "model.prefill-only": ", prefill only",
    "model.mutates": "the attention function writes into its argument(s) {names} (an in-place "
                     "op): the model's cache or projections change under it",
    "model.shape": "the attention function returned {shape}, transformers expects "
                   "(B, Tq, H, Dv) = {want}",
    "model.shape-transposed": "the attention function returned {shape}, transformers expects "
                              "(B, Tq, H, Dv) = {want} (a (B, H, Tq, Dv) output not "
                              "transposed?)",
    "model.mask-lets": "the mask this call received lets query {query} (position {q_pos}) of "
                       "batch row {batch} see key {key} (position {k_pos}), {why}, which the "
                       "model's config and padding exclude",
    "model.mask-hides": "the mask this call received hides key {key} (position {k_pos}), a "
                        "real key, from query {query} (position {q_pos}) of batch row "
                        "{batch}; the model's config and padding allow it",
    "model.failure-key": "step {step}, batch {batch}, query {query}, key {key}",
    "model.failure-head": "step {step}, batch {batch}, head {head}, query {query}",
    "model.failure-raised": "step {step}: raised",
    "measured.pairs-differ": "{n} (row, query) pairs differ",
    "measured.rows": "{n} rows",
    "model.non-finite": "the attention output has NaN/inf where the oracle is finite",
    "model.non-finite-kv": "the attention output has NaN/inf where the oracle is finite (k/v "
                           "hold NaN/inf at {n} key(s) the mask excludes, e.g. from an "
                           "earlier layer's rows with no allowed key: they reach the output "
                           "as 0 * NaN)",
    "model.half-non-finite": "NaN/inf in {dtype} where the same call in float32 is finite: "
                             "{cause}",
    "model.causal-leak": "the attention function lets queries see later keys that the mask "
                         "it received forbids (it ignores the causal part of the mask, or "
                         "builds none): a token's output depends on tokens after it",
    "model.padding-ignored": "real queries put weight on padded keys: the attention function "
                             "does not apply the padding in the mask it received (it builds "
                             "its own causal mask, or drops attention_mask)",
    "model.polarity": "the attention function reads the mask it receives the other way "
                      "round: it attends exactly the keys the mask excludes",
    "model.top-left": "the attention function aligns causal top-left (query i sees keys "
                      "j <= i) on a call with Tq = {Tq} != Tk = {Tk} (a step with a KV "
                      "cache): the model means bottom-right (j <= i + Tk - Tq), so decoding "
                      "sees the wrong keys",
    "model.window": "the attention function ignores the sliding window of {window} this "
                    "layer has (it attends keys {window} or more positions back, which the "
                    "mask it received excludes)",
    "model.scale": "the scores are {scaled} (the model passes scaling={scale:.4g})",
    "model.beyond-rule": "the attention output is further from the oracle than 2x the error "
                         "of plain {dtype} math",
    "model.half-raises": "the attention function raises in {dtype} but not in float32 "
                         "({error}): {cause}",
    "model.raised": "the attention function raised {error} at step {step}, layer {layer}: "
                    "{line} (q {q}, k {k}, {dtype}); the layers after it did not run",
    "model.empty-nan": "queries with no allowed key (padding) get NaN: through the padded "
                       "tokens it can reach later layers; attnkit, SDPA and flash-attn give 0",
    "why.empty-slot": "an empty cache slot",
    "why.padded": "a padded key",
    "why.own-mask": "a key this layer's own mask code excludes",
    "why.future": "a future key",
    "why.window": "outside the sliding window of {window}",
    "why.chunk": "in another chunk of {chunk}",
    "why.document": "in another packed document",
    "why.other": "a key the model does not allow",
    "why.real": "a real key it should see",
})
TEXTS.update({
    "mask.none": "no mask",
    "mask.is-causal": " (is_causal)",
    "mask.window": " (sliding_window={window})",
    "mask.structured": "attnkit structured mask",
    "mask.block": "FlexAttention BlockMask",
    "mask.bool": "bool mask",
    "mask.additive": "additive float mask",
})
TEXTS.update({
    "model.embeddings": "embeddings",
    "model.after-layer": "after layer {i}",
    "model.side-encoder": "encoder {what}",
    "model.side-decoder": "decoder {what}",
})
TEXTS.update({
    "model.layer not checked": "  warning  not checked: {layer}: {why}",
    "model.layers not checked": "{n} attention layer(s) not checked: the verdict covers the "
                                "others only",
})
# -- facts about the model, the run's refusals and reasons (model/facts.py, steps.py, check.py,
# report.py) ----------------------------------------------------------------------------------
TEXTS.update({
    "model.fact line": "  note: {note}",
    "fact.own-mask": "{name}: {what}; judged against the mask the model's own code builds",
    "fact.causal-own": "causal, which the model's code builds itself (its attention module "
                       "says is_causal=False)",
    "fact.bidirectional": "bidirectional (its config or module says causal)",
    "fact.two-sided": "a two-sided window: each query sees {back} key(s) before it and "
                      "{ahead} after it",
    "fact.window": "a sliding window of {n} key(s)",
    "fact.across-documents": "it attends across packed documents (the model does not split "
                             "them: packing them is the caller's choice)",
    "fact.other-mask": "another mask than its config says",
    "model.too-long": "the input needs {tokens} positions (with its decoding steps), more "
                      "than this model's {field} = {limit}: give a shorter --length",
    "model.no-decoding": "decoding not applicable: {model} has no language-model head "
                         "(logits); the prefill was checked",
    "model.generate-path": "model.generate(), {cache}",
    "model.cache-dynamic": "dynamic cache",
    "model.cache-static": "static cache",
    "model.failed because": "FAILED: {reason}",
    "model.unloaded": "{name} could not be loaded: {why}",
    "model.unchecked-under": "{n} attention layer(s) not checked under {name}: {names}",
    "model.and-more": "{names} and {n} more",
    "model.reproducer-unsaved": "# the reproducer could not be saved: {error}",
})

# -- what the command and check_model refuse to run, in one line (model/load.py, check.py,
# session.py, command.py, zoo.py) -------------------------------------------------------------
TEXTS.update({
    "load.dtype": "dtype must be one of {choices}, got {got!r}",
    "load.tiny": "--tiny must be one of {choices}, got {got!r}",
    "load.not-found": "MODEL {model!r} is not a local folder with a config.json nor a "
                      "config.json file (attnkit check model downloads nothing)",
    "load.unreadable": "MODEL {model!r}: cannot read {file}: {error}",
    "load.remote-code": "MODEL {model!r} needs trust_remote_code (its own Python code, or no "
                        "model_type transformers knows): attnkit check never runs it",
    "load.unknown-type": "MODEL {model!r}: transformers does not know model_type {type!r}; "
                         "reading it would mean running the model's own code "
                         "(trust_remote_code), which attnkit check never does",
    "load.cannot-build": "MODEL {model!r}: cannot build the model: {error}",
    "load.cannot-load": "MODEL {model!r}: cannot load the weights: {error}",
    "load.padding": "padding must be 'left', 'right' or 'none', got {got!r}",
    "load.sizes": "batch and length must be >= 1, got {batch} and {length}",
    "load.no-input-ids": "inputs need input_ids, got {got}",
    "load.ids-shape": "{name} must be a (B, T) tensor, got {got}",
    "load.ids-dtype": "{name} must hold integer token ids, got {dtype} {shape}",
    "load.ids-empty": "{name} must have batch and length >= 1, got {shape}",
    "load.ids-batch": "{name} {shape} has another batch than input_ids {want}",
    "load.ids-vocab": "{name} {shape} holds ids from {low} to {high}; the model's vocabulary "
                      "has ids 0 to {last}",
    "load.mask-shape": "attention_mask {got} does not match input_ids {shape}",
    "load.mask-values": "attention_mask {got} must hold 0 (padding) and 1 (a real token), "
                        "got values {values}",
    "load.positions-shape": "position_ids {got} does not match input_ids {shape}",
    "load.generate": "generate must be >= 0, got {got}",
    "load.sample": "sample must be >= 1 or None, got {got}",
    "load.no-implementations": "implementations is empty",
    "load.packed-decoding": "packed inputs (position_ids without attention_mask) are checked "
                            "in the prefill only: pass generate=0",
    "load.unknown-implementation": "attn_implementation {name!r} is not registered with "
                                   "transformers' AttentionInterface (known: {known})",
    "load.unknown-implementations": "implementations {names} are not registered with "
                                    "transformers' AttentionInterface (known: {known}); "
                                    "register yours with AttentionInterface.register(name, fn)",
    "load.no-architecture": "transformers {version} has no {name}",
    "cmd.model-or-tiny": "give MODEL (a local folder, a config.json or FILE.py:NAME) or "
                         "--tiny FAMILY, not both",
    "cmd.no-implementations": "--implementations is empty",
    "cmd.layers": "--layers needs --implementation FILE.py:FN",
})
