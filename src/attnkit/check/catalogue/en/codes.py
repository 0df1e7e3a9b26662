"""English: what each code means (en/__init__.py)."""

from __future__ import annotations

# code -> title, what is wrong, why it matters, how to fix it.
CODES: dict[str, dict[str, str]] = {
    "call-failed": dict(
        title="the target could not be built, loaded or called",
        what="The checker could not build, load or call what it was given, so nothing was "
             "judged.",
        why="A target the checker cannot call is a target nobody has tested; the report says "
            "which calls were tried and the first line of what each raised.",
        fix="Pass an instance, or write a factory `make(E, H)` that builds it; declare the "
            "mask argument with --convention; wrap a function whose arguments the check "
            "cannot fill in a lambda."),
    "nondeterministic": dict(
        title="two identical calls give different outputs",
        what="Two calls with the same inputs give different outputs.",
        why="Every comparison with the oracle would be noise; usually dropout is still on.",
        fix="Call `.eval()`, or pass dropout 0 (`training=self.training` to F.dropout)."),
    "shape": dict(
        title="wrong output shape",
        what="The output does not have the expected shape, or the call raises on shapes it "
             "should take.",
        why="A wrong shape is usually a head split or merge written with view and transpose "
            "in the wrong order, or a reduction without keepdims.",
        fix="Split heads with `x.view(B, T, H, D).transpose(1, 2)` and merge with "
            "`.transpose(1, 2).reshape(B, T, H * D)`; keep reduced axes with keepdims."),
    "nan-or-inf": dict(
        title="NaN or inf where the oracle is finite",
        what="The output holds NaN or inf where the float64 oracle is finite.",
        why="A softmax without the max trick overflows exp() at logits near 1e3; a row with "
            "no allowed key gives 0/0.",
        fix="Subtract each row's maximum before exp(); give rows with no allowed key 0."),
    "float16-overflow": dict(
        title="fails or goes non-finite in half precision only",
        what="In float32 everything is fine; in float16 or bfloat16 the call raises or "
             "gives NaN/inf.",
        why="float16 holds at most 65504: a fill like -1e9 becomes -inf, and exp() overflows "
            "sooner.",
        fix="Fill with -inf (and guard rows with no allowed key) or torch.finfo(dtype).min; "
            "keep softmax statistics in float32."),
    "mask-polarity": dict(
        title="the mask is read with the opposite meaning",
        what="The mask is read the other way round: the keys it should hide are attended, "
             "the keys it should keep are hidden.",
        why="attnkit, SDPA and JAX read True as 'may attend'; nn.MultiheadAttention's "
            "attn_mask reads True as 'masked'. Mixing the two silently attends padding.",
        fix="Follow one convention: `scores.masked_fill(~keep, -inf)` for a keep-mask, "
            "`scores.masked_fill(masked, -inf)` for a True = masked one."),
    "mask-mismatch": dict(
        title="a model's attention gets (or applies) another mask than its config and "
              "padding call for",
        what="The mask an attention call receives differs from the one the model's config "
             "and the inputs' padding call for.",
        why="A query that sees padding or the future, or misses keys it should see, changes "
            "every layer after it.",
        fix="Build the mask from the config (causal, sliding window, chunks) and the padding; "
            "the report names the first query and key that differ."),
    "wrong-scale": dict(
        title="scores scaled by something other than 1/sqrt(Dk)",
        what="The scores are not divided by sqrt(Dk) (Dk: the query/key head dim), or are "
             "scaled by something else.",
        why="Scaled dot-product attention is softmax(q k^T / sqrt(Dk)) v: another scale "
            "makes the weights too sharp or too flat.",
        fix="Multiply the scores by `1 / math.sqrt(q.shape[-1])`, the head dim, not the "
            "model width."),
    "inaccurate": dict(
        title="beyond the 2x/3x/5x error rule",
        what="The result is further from the float64 oracle than twice the error of plain "
             "math in the same precision (3x or 5x for gradients).",
        why="Beyond that rule the formula is wrong, or precision is lost that plain math "
            "keeps.",
        fix="Check the formula on the case the report names (its reproducer prints both "
            "results), then look for a needless loss of precision."),
    "mutates-input": dict(
        title="writes into an argument",
        what="The code writes into a tensor its caller passed (masked_fill_, mul_, "
             "x[mask] = ...).",
        why="The caller's data changes under it: a cache, a mask or a batch is silently "
            "wrong afterwards.",
        fix="Work on a copy, or use the out-of-place op (masked_fill, not masked_fill_)."),
    "gradient": dict(
        title="gradients disagree with the oracle",
        what="A gradient disagrees with the oracle's (or with central differences).",
        why="Training follows the gradient: a wrong one trains the wrong model without an "
            "error.",
        fix="Check a hand-written backward term by term against softmax's Jacobian; with "
            "autograd, look for a detach or an in-place op that cuts the graph."),
    "unregistered-parameter": dict(
        title="a parameter the module does not register",
        what="A trained tensor is not registered with the module.",
        why="The optimizer, .to()/.half() and state_dict() never see it: it never trains "
            "and is never saved.",
        fix="Keep layers in nn.ModuleList/nn.ModuleDict (never a plain list) and tensors in "
            "nn.Parameter."),
    "no-gradient": dict(
        title="a parameter that never gets a gradient",
        what="After backward, a registered parameter's gradient is still None.",
        why="It takes no part in the forward pass: a layer defined and never used.",
        fix="Use the layer in forward, or remove it."),
    "state-dict": dict(
        title="state_dict does not round-trip the module",
        what="A fresh module loaded with this one's state_dict gives other outputs.",
        why="Some state that changes the output is not saved: a saved model is not the "
            "model.",
        fix="Register every tensor that matters as a parameter or with register_buffer."),
    "dropout-in-eval": dict(
        title="dropout still active after eval()",
        what="After eval(), two identical calls still differ: dropout does not follow "
             "self.training.",
        why="Evaluation and inference are random, and worse than the trained model.",
        fix="Use an nn.Dropout module, or pass `training=self.training` to F.dropout."),
    "causal-leak": dict(
        title="declared causal, a query sees later positions",
        what="Declared causal, the code lets a query see keys after its position.",
        why="A language model trained so reads the answer it is meant to predict.",
        fix="Mask the scores of keys j > i + Tk - Tq (bottom-right) before the softmax."),
    "padding-ignored": dict(
        title="a padded key gets weight",
        what="A real query gives weight to keys at padded positions: the attention ignores "
             "the padding mask it was given.",
        why="The same sentence then gets another output when the batch is padded "
            "differently, and padding tokens leak into every real position.",
        fix="Apply the padding mask (attention_mask, key_padding_mask or valid_lens) to the "
            "scores before the softmax, together with any causal mask."),
    "mixes-queries": dict(
        title="a query's output changes with another query: heads split or merged so that "
              "tokens mix",
        what="Changing one query changes the outputs of other queries.",
        why="Each query's output may depend only on itself and the keys and values; mixing "
            "comes from splitting or merging heads without the transpose.",
        fix="Split with `x.view(B, T, H, D).transpose(1, 2)`, not `x.view(B, H, T, D)`; merge "
            "with `out.transpose(1, 2).reshape(B, T, E)`, not `out.view(B, T, E)`."),
    "post-norm": dict(
        title="a block normalises after the residual add where pre-norm was asked",
        what="The block normalises after the residual add, `norm(x + attn(x))` (post-norm, "
             "the original Transformer's layout), where a pre-norm block was asked, "
             "`x + attn(norm(x))` (GPT-2, Llama).",
        why="In a pre-norm block x itself passes through untouched, so a deep stack trains "
            "without a warm-up; post-norm puts a norm on the residual path of every layer.",
        fix="Write `x = x + attn(norm1(x))`, then `x = x + mlp(norm2(x))`: the norms go "
            "inside the branches, never after the add."),
    "residual": dict(
        title="a block's residual path is not x + sublayer(norm(x))",
        what="The block's residual path is not `x + sublayer(norm(x))`: a sublayer's output "
             "replaces x instead of being added to it, or a sublayer reads x without its "
             "norm.",
        why="Without the added path a stack of blocks loses its input and trains badly; a "
            "sublayer fed the raw x sees inputs whose size grows layer after layer.",
        fix="Add each sublayer's output to x, and feed each sublayer the normalised x: "
            "`x = x + attn(norm1(x))`, `x = x + mlp(norm2(x))`."),
    "fully-masked-row": dict(
        title="a row with no allowed key is not 0",
        what="A query with no allowed key gets something other than 0 (often the mean of "
             "the values).",
        why="A convention, not necessarily a bug: attnkit, SDPA (2.5+) and flash-attn give "
            "0; JAX and d2l a uniform row.",
        fix="If you want 0, zero the rows whose mask allows no key after the softmax."),
    "causal-alignment": dict(
        title="causal mask aligned top-left, not bottom-right",
        what="With Tq != Tk the causal mask is aligned top-left (query i sees keys j <= i), "
             "not bottom-right (j <= i + Tk - Tq).",
        why="Decoding with a KV cache needs bottom-right: the last query sees every key. "
            "SDPA's is_causal is top-left too, so for a lone function it is a convention; "
            "inside a model it is an error.",
        fix="Build the mask with `torch.ones(Tq, Tk).tril(Tk - Tq)`."),
    "one-sequence": dict(
        title="takes one sequence, not a batch: checked one sequence at a time",
        what="The function is written for one sequence (2-D q, k, v of shape (T, D)) and "
             "raises on batched inputs; the checker called it once per batch row and head "
             "and judged the stacked outputs.",
        why="A layout, not a bug, as long as it is meant so; batched code usually breaks by "
            "k.T, which reverses every axis instead of the last two.",
        fix="To take a batch, swap only the last two axes (np.swapaxes(k, -1, -2) or "
            "k.transpose(-1, -2)) and reduce over axis -1."),
}
