"""English: the sentences of the multi-head oracle (multihead/oracle.py): the structure it
read, why it did not compare, and the causes it names."""

from __future__ import annotations

TEXTS: dict[str, str] = {
    "oracle.label-separate": "separate q/k/v nn.Linear",
    "oracle.label-separate-dh": "separate q/k/v nn.Linear, columns (d, H)",
    "oracle.label-fused": "fused qkv nn.Linear, chunks in {order} order",
    "oracle.label-interleaved": "fused qkv nn.Linear, per head ({order}) interleaved",
    "oracle.label-q-fused-kv": "q nn.Linear and a fused {order} nn.Linear",
    "oracle.label-cycle": "{label}, query head h on key/value head h % Hkv",
    "oracle.heads": "{H} heads of {d}",
    "oracle.heads-kv": "{H} heads of {d}, {Hkv} key/value heads",
    "oracle.heads-1": "1 head of {d}",
    "oracle.heads-kv-1": "{H} heads of {d}, 1 key/value head",
    "oracle.out-bias": "output projection with bias",
    "oracle.out-no-bias": "output projection without bias",
    "oracle.out-none": "no output projection",
    "oracle.out-then": "output projection, then a step after it that is not read (a residual?)",
    "oracle.structure": "{label}, {heads}, {how}",
    "oracle.structure-causal": "{label}, {heads}, {how}, causal",
    "oracle.offset": "{structure}, a constant added after the attention (as a bias on v)",
    "oracle.inner-torch": "torch.nn.MultiheadAttention",
    "oracle.inner-attnkit": "attnkit MultiHeadAttention",
    "oracle.inner-named": "{label} ({name})",
    "oracle.inner-structure": "{label}, {heads}",
    "oracle.inner-alone": (
        "{structure} (compared on the inputs it got; the wrapper around it is not read)"
    ),
    "oracle.mixing": "the attention core disagrees: the queries' outputs mix",
    "oracle.why-raised": "the module raised on the call that reads its structure ({error})",
    "oracle.why-output-shape": "its output is {shape}, not (B, T, E)",
    "oracle.why-random": "two identical calls give different outputs (dropout left on?)",
    "oracle.why-numpy": "a NumPy module: its weights are not read",
    "oracle.why-not-reached": "the check stopped before the comparison (see the findings)",
    "oracle.why-no-linear": (
        "no nn.Linear runs in forward: projections written with raw parameters (x @ W) are "
        "not read, only nn.Linear and nn.MultiheadAttention"
    ),
    "oracle.why-input-changed": (
        "no nn.Linear reads the module's input as it was given (something runs on it first: "
        "a norm, a positional embedding)"
    ),
    "oracle.why-layout": (
        "{nq} nn.Linear layer(s) read the query input and {nkv} the key/value input, with "
        "widths {widths}: not a layout the check reads (separate q/k/v, one fused qkv "
        "projection, or q and a fused kv)"
    ),
    "oracle.why-norm": (
        "{cls} ({name}) runs in forward besides the projections (a norm), and the attention "
        "core does not follow from the captured q, k, v without it"
    ),
    "oracle.why-module": (
        "{cls} ({name}) runs in forward besides the projections (rotary or other position "
        "embeddings?), and the attention core does not follow from the captured q, k, v "
        "without it"
    ),
    "oracle.why-other": (
        "{cls} ({name}) runs in forward besides the projections, and the attention core does "
        "not follow from the captured q, k, v without it"
    ),
    "oracle.why-not-dot-product": (
        "the output is not linear in what its projections give as v, as dot-product "
        "attention's is (additive attention, or values that pass through something else): "
        "only dot-product attention is compared"
    ),
    "oracle.why-parameters": (
        "parameters outside its nn.Linear layers ({names}) take part in forward, and the "
        "attention core does not follow from the captured q, k, v without them (learned "
        "keys, a temperature?): they are not read"
    ),
    "oracle.why-positions": (
        "the outputs depend on the positions (permuting the tokens does not permute the "
        "outputs): rotary or relative position embeddings, or a mask built from the "
        "positions (a window), which the check does not read; or heads split with "
        "view(B, H, T, d) without the transpose, which mixes the tokens"
    ),
    "oracle.why-causal": (
        "the causal attention core does not follow from the captured q, k, v by any reading "
        "the check knows, and a causal module's position-dependent scores are not probed"
    ),
    "oracle.why-inner": "{label}: {why}",
    "oracle.why-inner-bias-kv": "its add_bias_kv / add_zero_attn are not read",
    "oracle.why-inner-softcap": "its softcap / sinks are not read",
    "oracle.why-inner-inputs": "it got inputs the check does not read",
    "oracle.why-inner-kv": "it got different key and value inputs",
    "oracle.why-inner-float-mask": "the float {name} it gets is not read",
    "oracle.why-inner-head-mask": "a per-head attn_mask is not read",
    "oracle.why-inner-argument": "its {name}= argument is not read",
    "oracle.why-inner-lens": "per-query valid_lens are not read",
    "oracle.why-inner-causal": "causal={value} is not read",
    "oracle.scale-none": "not scaled: the 1/sqrt(Dk) is missing",
    "oracle.scale-sqrt(E)": (
        "scaled by 1/sqrt(E) = {value:.4g}, the model width, instead of 1/sqrt(Dk) = "
        "{default:.4g}, the head dim"
    ),
    "oracle.scale-1/d": "scaled by 1/Dk = {value:.4g} instead of 1/sqrt(Dk) = {default:.4g}",
    "oracle.scale-sqrt(d)": "multiplied by sqrt(Dk) = {value:.4g} instead of divided by it",
    "oracle.scale-E or d": (
        "scaled by {value:.4g}, which is 1/sqrt(E) (the model width) and also 1/Dk at this "
        "width, instead of 1/sqrt(Dk) = {default:.4g}"
    ),
    "oracle.scale-constant": (
        "scaled by {value:.4g} at every head dim (a constant, where 1/sqrt(Dk) changes with "
        "the head dim: {default:.4g} here)"
    ),
    "oracle.scale-fitted": "scaled by {value:.4g} (fitted) instead of 1/sqrt(Dk) = {default:.4g}",
    "oracle.wrong-scale": (
        "the attention scores are {words}; scaled dot-product attention divides q.k by "
        "sqrt(Dk) (found in the attention core, from the q, k, v the module's projections "
        "produced)"
    ),
    "oracle.wrong-scale-measured": (
        "the core fits the oracle with scale {scale:.4g}, not {default:.4g}"
    ),
    "oracle.diagonal-masked": (
        "the causal mask hides the diagonal too: each query sees only earlier keys, not its "
        "own (a mask of triu(ones, diagonal=0), or a keep of tril(ones, diagonal=-1)); mask "
        "only the later keys: triu(ones, diagonal=1) as the mask, tril(ones) as the keep"
    ),
    "oracle.diagonal-masked-measured": (
        "queries 1.. fit the oracle with the diagonal masked (query 0 then sees no key)"
    ),
    "oracle.tokens-alone": (
        "no token's output reads another token: the attention runs over the heads, not over "
        "the tokens (q, k, v viewed as (B, T, H, Dk) without transpose(1, 2), so the scores "
        "are (B, T, H, H)); split the heads with .view(B, T, H, Dk).transpose(1, 2)"
    ),
    "oracle.tokens-alone-measured": "changing token 0 moves no other token's output",
    "oracle.queries-axis": (
        "the softmax runs over the queries axis (dim=-2 of the (..., Tq, Tk) scores), not "
        "over the keys: each query's weights must sum to 1 over the keys (softmax(scores, "
        "dim=-1))"
    ),
    "oracle.queries-axis-measured": "the core fits the oracle with the softmax over the queries",
    "oracle.sigmoid": (
        "the attention weights are sigmoid(scores), which do not sum to 1 over the keys: use "
        "softmax(scores, dim=-1)"
    ),
    "oracle.sigmoid-measured": (
        "the core fits sigmoid weights; a query's weights sum to {lo:.3g} to {hi:.3g} over "
        "the keys"
    ),
    "oracle.heads-count": (
        "the module computes {H2} head(s) of {d2}, not {H} heads of {d}: the heads are split "
        "or merged wrongly"
    ),
    "oracle.heads-count-measured": "the core fits the oracle at {H2} heads",
    "oracle.merge-no-transpose": (
        "the heads are merged without the transpose: the attention output (B, H, T, Dk) is "
        "reshaped straight to (B, T, E), so each token's row holds pieces of other tokens "
        "(and later tokens reach earlier ones); merge with out.transpose(1, 2).reshape(B, T, E)"
    ),
    "oracle.merge-no-transpose-measured": (
        "the output projection's input equals the oracle's (B, H, T, Dk) core read as "
        "(B, T, E) without the transpose"
    ),
    "oracle.batch-mixing": (
        "changing one example of the batch changes another example's output: the heads are "
        "split or merged across the batch (a reshape of a fused qkv (B, T, 3E) straight to "
        "(3, B, H, T, d), or a view without the transpose); split with qkv.view(B, T, 3, H, "
        "d).permute(2, 0, 3, 1, 4)"
    ),
    "oracle.batch-mixing-measured": "example 0's output moved when only example 1's input changed",
    "oracle.unexplained": (
        "the attention core (softmax(q k^T / sqrt(Dk)) v on the q, k, v the module's "
        "projections produced) disagrees with the oracle, and no reading the check knows "
        "explains it (scale, softmax axis, sigmoid, head count, q/k/v order)"
    ),
    "oracle.no-reading": "no reading fits",
    "oracle.case": "the oracle: the attention core and the output, from the module's own weights",
    "oracle.whole": (
        "the attention core agrees with the oracle on the q, k, v the module's projections "
        "produced, but the output does not agree with the oracle from the module's own "
        "weights: the error is in the projections or the output projection, not in the "
        "attention"
    ),
    "oracle.inner-disagrees": "{label} disagrees with the oracle on the inputs it got",
    "oracle.inner-batch-first": (
        "{label} has batch_first=False and gets (B, T, E) inputs: it reads the batch axis as "
        "positions, so the examples of a batch attend to each other; build it with "
        "batch_first=True or pass x.transpose(0, 1)"
    ),
    "oracle.inner-wrapper": (
        "{label} agrees with the oracle on the inputs it got, but the module's output does "
        "not agree with the oracle on the module's inputs: the wrapper feeds it (or reads "
        "its output) wrongly"
    ),
    "report.oracle-compared": (
        "compared with the float64 oracle from the module's own weights: {structure}"
    ),
    "report.oracle-not-compared": "not compared with the oracle: {why}",
    "report.no-findings-not-compared": (
        "no findings from the property probes (not compared with the oracle, see above)"
    ),
    "oracle.value-from-key": (
        "the values are projected from the key input (self.{v} reads key): value is never "
        "read, so the output is wrong wherever value differs from key; project v from value "
        "(self.{v}(value))"
    ),
    "oracle.key-from-value": (
        "the keys are projected from the value input (self.{k} reads value): key is never "
        "read; project k from key (self.{k}(key))"
    ),
    "oracle.key-value-swapped": (
        "key and value are swapped: the keys are projected from the value input (self.{k} "
        "reads value) and the values from the key input (self.{v} reads key); project k "
        "from key and v from value"
    ),
    "oracle.split-no-transpose": (
        "the heads are split without the transpose: view(B, H, T, Dk) reads a projection's "
        "output (B, T, E) straight as heads, so each head's rows hold pieces of several "
        "tokens and the attention mixes the tokens; split with "
        ".view(B, T, H, Dk).transpose(1, 2)"
    ),
    "oracle.split-no-transpose-measured": (
        "the attention core fits the oracle on q, k, v read as (B, H, T, Dk) straight from "
        "the projections, without the transpose"
    ),
    "oracle.inner-value-from-key": (
        "{label} gets the key input as its value: value is never read, so the output is "
        "wrong wherever value differs from key; pass (query, key, value)"
    ),
    "oracle.inner-key-from-value": (
        "{label} gets the value input as its key: key is never read; pass (query, key, value)"
    ),
    "oracle.inner-key-value-swapped": (
        "{label} gets key and value the wrong way round (query, value, key); pass "
        "(query, key, value)"
    ),
}
