"""English: the sentences of the multi-head checks."""

from __future__ import annotations

TEXTS: dict[str, str] = {}

# -- the multi-head probes (multihead/) ---------------------------------------------------
TEXTS.update({
    "mha.mask-ignored": "values at masked keys change the output: the mask is ignored or "
                        "misapplied",
    "mha.mask-on-queries": "the mask is applied on the query axis: the masked positions' "
                           "own outputs are blanked while every query still attends the masked "
                           "keys; a per-key mask (B, Tk) goes on the last axis of the scores, "
                           "mask[:, None, None, :]",
    "mha.polarity": "the module reads the mask the other way round from the '{convention}' "
                    "convention: it attends exactly the keys the mask excludes",
    "measured.max-change": "max change {value:.3g}",
    "mha.empty-row-nan": "a query with no allowed key gives NaN: guard empty rows so they "
                         "give 0",
    "measured.nan-empty-row": "NaN on the fully masked row",
    "mha.uniform-additive": "an additive finfo.min mask leaves a uniform row, as "
                            "transformers' eager attention does",
    "mha.uniform-fill": "{fill} leaves a uniform row",
    "mha.empty-row-averages": "a query with no allowed key still averages the values ({why}); "
                              "attnkit, SDPA and flash-attn give attention output 0",
    "measured.moves-with-values": "its output moves with the values",
    "mha.causal-leak": "declared causal, the module lets position i see later positions: "
                       "changing x at positions 3 and 4 changes the outputs at 0..2 (apply "
                       "the causal mask, e.g. scores.masked_fill(~torch.tril(...), -inf), "
                       "before the softmax)",
    "measured.early-moved": "outputs at positions 0..2 moved",
    "mha.mixes-queries-lengths": "changing query {query} alone changes the outputs of queries "
                                 "{moved}, and the module raises when queries and keys differ "
                                 "in length: the query and key lengths are mixed, so the "
                                 "scores are not (B, Tq, Tk) normalised over the keys; look "
                                 "for the unsqueeze, transpose, view or reshape that swaps them",
    "mha.mixes-queries": "changing query {query} alone changes the outputs of queries "
                         "{moved}: a query's output must depend only on its own query and the "
                         "keys/values. The heads are split or merged so that tokens mix: split "
                         "with x.view(B, T, H, Dk).transpose(1, 2), not x.view(B, H, T, Dk); "
                         "merge with out.transpose(1, 2).contiguous().view(B, T, E), not "
                         "out.view(B, T, E)",
    "measured.queries-moved": "outputs of queries {moved} moved, max change {value:.3g}",
})
TEXTS.update({
    "mha.no-gradient": "registered parameter(s) {names} never get a gradient: they do not "
                       "take part in the output (unused, or detached); they never train",
    "measured.grad-none-count": "{n} parameter(s) with grad None",
    "mha.grad-non-finite": "gradients hold NaN/inf for finite inputs",
    "measured.grad-non-finite": "non-finite gradient",
    "mha.grad-differences": "the module's gradients disagree with central differences of its "
                            "own forward (in float64): a hand-written backward is wrong",
    "measured.directional": "directional derivative {analytic:.6g} by autograd, "
                            "{numeric:.6g} by central differences (relative error {rel:.2e} "
                            "> 1e-2)",
    "mha.state-dict-load": "a fresh module cannot load this one's state_dict ({error})",
    "mha.state-dict": "a fresh module loaded with this one's state_dict gives other outputs",
    "mha.state-dict-plain": "a fresh module loaded with this one's state_dict gives other "
                            "outputs: tensors kept as plain attributes ({names}) are not "
                            "saved; register them with register_buffer (.to() and .half() "
                            "miss them too)",
    "measured.max-difference": "max difference {value:.3g}",
    "mha.dropout-in-eval": "after eval() the module still drops attention weights at random: "
                           "pass training=self.training to F.dropout (or use an nn.Dropout "
                           "submodule)",
    "mha.nondeterministic": "two identical calls give different outputs: dropout is on: pass "
                            "dropout 0, or draw random numbers (dropout, weights drawn per "
                            "call) only in training",
    "measured.eval-differ": "two eval() calls differ by {value:.3g}",
    "measured.nan-in-output": "NaN/inf in the output",
    "mha.half": "the module fails in {dtype} where float32 is fine ({problem}); {cause}",
})
TEXTS.update({
    "mha.mutates": "the module writes into its input {name} (an in-place op on it): the "
                   "caller's tensor changes",
    "try.output-shape-only": "{label}: output shape {shape}",
    "mha.call-words": "{call} on {layout} inputs",
    "mha.unregistered": "{holder} holds tensors the module does not register ({n}, e.g. "
                        "{first}): .parameters() (so the optimizer), .to()/.half() and "
                        "state_dict() never see them; keep modules in nn.ModuleList/"
                        "nn.ModuleDict and tensors in nn.Parameter/nn.ParameterList",
    "measured.unregistered": "{n} unregistered: {names}",
    "mha.raises-on-lengths": "the module runs when queries and keys are as long (Tq = Tk) and "
                             "raises on query {query}, key/value {kv}: {error} The code uses "
                             "the query length where the key length belongs, or the other way "
                             "round: the scores must be (B, Tq, Tk); look for the unsqueeze, "
                             "transpose, view or reshape that mixes the two lengths",
    "mha.raises-on": "the module raises on query {query}, key/value {kv}: {error}",
    "mha.not-callable-as": "the module could not be called as {call}: {error}; declare the "
                           "mask with --convention, or wrap the module in a factory whose "
                           "forward takes (query, key, value) or (x)",
    "mha.output-shape": "output shape {shape}, expected {want} (query length Tq = {Tq}, key "
                        "length {Tk})",
    "mha.no-max-trick": "the module gives NaN/inf for finite inputs whose scores reach "
                        "~1e3-1e4: a softmax without the max trick overflows exp(); subtract "
                        "the row maximum first (torch.softmax does)",
    "measured.non-finite-at": "{n} of {size} outputs non-finite at inputs x {scale}",
})
TEXTS.update({
    "mha.no-mask-layout": "the module's {name}= took none of the mask layouts the check "
                          "knows (first: {first}), so masks were not tested; declare the mask "
                          "with --convention, or write the factory it needs and check that: "
                          "{factory}",
    "measured.tried-layouts": "tried {tries}",
    "mha.raised": "{what} raised {error}; {fix}",
    "mha.building": "building the module{tried}",
    "mha.fix-factory": "if the arguments are wrong for it, write a factory: def make(E, H): "
                       "return YourClass(...) and check file.py:make",
    "mha.gives-not-callable": "{how} gives a {type}, which cannot be called: pass the class, "
                              "an instance or a factory that returns the module",
    "mha.calling": "calling the module as {call} on {shape} inputs",
    "mha.calling-mask": "calling the module as {call} on {shape} inputs (a mask goes as "
                        "{name}=)",
    "mha.fix-call": "check that forward takes the inputs positionally or by the names "
                    "query/key/value; declare the mask with --convention (none if forward's "
                    "extra argument is not a mask), or write a factory that wraps the module",
    "mha.calling-with-mask": "calling the module with a mask",
    "mha.fix-mask": "declare how it reads its mask with --convention (none if it takes no "
                    "attention mask)",
    "how.no-layout": "{name}= took no known layout: masks not tested",
    # usage errors: a convention that does not fit (raised as ValueError, said by the CLI)
    "mha.convention-choices": "convention must be one of auto, valid_lens, masked, keep, "
                              "additive, none; got {got}",
    "mha.no-mask-to-declare": "--convention {conv}: the module's forward takes no mask "
                              "argument (no parameter named mask, attn_mask, valid_lens...)",
    "header.self-attention": ", self-attention m(x)",
    "header.by-name": ", inputs by name {names}",
    "header.found-by-trying": " (found by trying)",
    "header.none-mixing": "none (masks not tested: the queries' outputs mix)",
    "header.behaves-causal": "behaves as causal: later positions do not change earlier "
                             "outputs",
    "header.bidirectional": "bidirectional: later positions change earlier outputs",
    "header.declared": " (declared causal)",
    "header.flag-set": ", {name}=True passed in every call",
    "probe.registration": "registration: every trained tensor is a registered parameter",
    "probe.mask-layouts": "masks: the mask layouts tried",
    "probe.causality": "causality: do changes at positions 3, 4 move outputs 0..2?",
    "probe.shapes-self": "shapes: Tq == Tk",
    "probe.shapes": "shapes: Tq == Tk, Tq < Tk, Tq > Tk",
    "probe.queries": "queries independent: does changing query 4 move outputs 0..3?",
    "probe.logits": "logits ~1e3 and ~1e4 (inputs scaled by 30 and 100)",
    "probe.masks-mixing": "masks: not tested, the queries' outputs mix (mixes-queries)",
    "probe.masks": "masked keys change nothing; a query with no allowed key",
    "probe.same-call": "the same call twice gives the same output",
    "probe.state-dict": "state_dict round trip into a fresh module",
    "probe.half": "{dtype} copy of the module",
    "probe.gradients": "gradients: every parameter gets one; float64 central differences",
    "probe.dropout": "eval(): dropout off (dropout set to 0.5 where the module has it)",
})
TEXTS.update({
    "mha.raised-at": "{what} raised {error} ({where}); {fix}",
    "mha.building-as": "building the module as {expr}",
    "mha.fix-factory-written": "if the arguments are wrong for it, write the factory it needs "
                               "and check that: def make(E, H): return {factory}, then attnkit "
                               "check multi-head {file}:make",
    "mha.per-example": "with a different mask per example, values at keys an example masks "
                       "change its output: masks are paired with the wrong examples (a mask "
                       "repeated over heads in another order than the scores' batch and heads: "
                       "use repeat_interleave, or expand to (B, H, Tq, Tk) before merging B "
                       "and H)",
    "measured.max-change-01": "max change {value:.3g} at queries 0 and 1",
    "probe.per-example": "masks per example: example 0 attends keys 0..1, example 1 keys 0..3",
    "try.seq-first": "{layout} with (T, B, E) inputs",
    "try.raised-at": "{label}: {error} ({where})",
    "where.line": "line {n}: {code}",
})
