"""English: what an output that misses the oracle computes instead (core/behaviour.py)."""

from __future__ import annotations

TEXTS: dict[str, str] = {
    "judge.mask-ignored": "the output is computed over every key, as if there were no mask: "
                          "the mask (or valid_lens) never reaches the softmax; set the "
                          "scores of the masked keys to -inf before it",
    "judge.weights-unmasked": "the returned weights are the softmax over every key (the output "
                              "is right): the weights you return were computed without the "
                              "mask; return the masked weights the output was made with",
    "judge.query-axis": "the softmax normalises over the queries (axis -2), not over the keys: "
                        "each column of the weights sums to 1 instead of each row; take the "
                        "softmax over the last axis (the keys)",
    "judge.lens-on-queries": "valid_lens cuts the queries (axis 1), not the keys: a query "
                             "i < valid_lens[b] sees every key and the others come out 0; "
                             "compare the lengths with the key index (the last axis)",
    "judge.first-length": "every query gets query 0's length: the per-query valid_lens "
                          "(B, Tq) was cut to its first column; compare key j with "
                          "valid_lens[b, i], each query its own length "
                          "(valid_lens[:, :, None])",
    "judge.parts-averaged": "the output is the plain average of the keys taken in {n} parts "
                            "(the first of {size} keys), each normalised on its own: weight a "
                            "part by its share of the softmax sum, exp(lse_part - lse); in an "
                            "online loop, rescale the old sums by alpha = exp(m_old - m_new) "
                            "and divide once at the end",
    "judge.parts-unnormalised": "the output is the keys taken in {n} parts (the first of {size} "
                                "keys) merged with weights exp(lse_part - max(lse)), which do "
                                "not sum to 1: the merged lse is np.logaddexp of the parts' "
                                "lse, not their maximum",
    "judge.blocks-not-rescaled": "the output is the keys taken in blocks ({n} blocks, the first "
                                 "of {size} keys) whose running sums are never rescaled: when "
                                 "the running max grows from m_old to m_new, multiply the old "
                                 "sum and accumulator by alpha = exp(m_old - m_new)",
    "judge.zero-slots": "the output is attention in which each key a query must not see is a "
                        "zero vector with a zero value (score 0, still in the softmax): slots "
                        "never filled are attended; return only the filled part of a cache "
                        "([..., :length, :]), or mask those keys with -inf",
    "judge.unread-keys": "changing the keys and values at position(s) {keys} (of {Tk}) changes "
                         "no output: the code never reads them; check the slice or loop bounds "
                         "that take the keys (a last, shorter block that range() skips; a cache "
                         "whose append writes at position 0, or whose keys() returns slots it "
                         "never filled)",
    "judge.lse-max-not-added": "each row comes out multiplied by exp(row max): the max subtracted "
                               "inside the log-sum-exp is never added back; "
                               "lse = m + log(sum(exp(x - m))), m the row maximum",
    "judge.no-max-trick-attention": "fn gives NaN/inf for finite inputs: exp() of a raw score, "
                                    "or of a log-sum-exp (lse), overflows; subtract the row "
                                    "maximum first, and merge parts with exp(lse_part - lse), "
                                    "never exp(lse_part)",
}
