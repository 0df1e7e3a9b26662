"""English: the sentences of the block check (``check_block``)."""

from __future__ import annotations

TEXTS: dict[str, str] = {
    "report.running-block": "the block",
    "block.shape": "the block returned {shape} for x of shape {want}; a block keeps the shape "
                   "of its input",
    "block.nan-or-inf": "the block's output holds NaN or inf on float32 inputs of size ~1",
    "measured.non-finite-output": "non-finite output",
    "block.causal-leak": "declared causal, the block lets position i see later positions: "
                         "changing x at positions 3 and 4 changes the outputs at 0..2 (its "
                         "attention needs causal=True, or the causal mask on its scores)",
    "block.post-norm": "the block normalises after the residual add (post-norm: "
                       "norm(x + attn(x))); pre-norm was asked: x = x + attn(norm1(x)), then "
                       "x = x + mlp(norm2(x)), so x itself passes through the block "
                       "un-normalised",
    "measured.returned-norm": "with both sublayers giving 0 the block returned norm(x), not x",
    "block.replaces": "with both sublayers giving 0 the block should return x itself; it does "
                      "not: a sublayer's output replaces x instead of being added to it (write "
                      "x = x + attn(norm1(x)) and x = x + mlp(norm2(x)))",
    "measured.max-from-x": "max |block(x) - x| {value:.3g}",
    "block.unnormed": "block(c x) - c x grows with c: a sublayer reads x without its norm "
                      "(pre-norm feeds each sublayer norm(x): attn(norm1(x)), mlp(norm2(x)))",
    "measured.growth": "|block(100 x) - 100 x| / |block(x) - x| = {value:.3g}",
    "case.block-x": "float32 x {shape}",
    "case.block-zeroed": "float32 x {shape}, every weight outside the norms set to 0",
    "case.block-scaled": "float32 x and 100 x",
}
