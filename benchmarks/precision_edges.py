"""Precision at large logits, every CPU backend vs plain float32 math (issue 16).

Not a timing: each row is a backend's max error against the float64 reference
(``attnkit.testing.reference_attention``) divided by the plain float32 math path's, for
outputs and gradients; DESIGN.md's rule allows 2 (out), 5 (dq), 3 (dk, dv), plus 1e-5
absolute. The first table is the bound of PyTorch's fused CPU kernel behind
``backend="sdpa"`` (documented in docs/torch.md); the second, attnkit's own blockwise paths
(NumPy flash, Triton in the interpreter, the ring's block ops) on the inputs that broke them.

Usage::

    python benchmarks/precision_edges.py           # records both tables (BENCHMARKS.md)
    python benchmarks/precision_edges.py --quick   # prints only
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import report  # noqa: E402


def _torch_ratios(arrays, backend):
    import torch

    import attnkit.torch as at
    from attnkit.testing import max_mean_error, reference_attention

    ref = reference_attention(*arrays[:3], d_out=arrays[3])
    errs = {}
    for name in (backend, "math"):
        q, k, v, do = (torch.from_numpy(x).float() for x in arrays)
        leaves = [t.requires_grad_(True) for t in (q, k, v)]
        out, _ = at.attention(*leaves, backend=name)
        out.backward(do)
        got = (out, *(t.grad for t in leaves))
        errs[name] = [max_mean_error(g, r)[0] for g, r in
                      zip(got, (ref.out, ref.dq, ref.dk, ref.dv))]
    return [a / b for a, b in zip(errs[backend], errs["math"])]


def sdpa_table(record: bool) -> None:
    rows = []
    for mult in (1, 5, 20, 50):
        for T in (45, 300):
            g = np.random.default_rng(11)
            arrays = (g.standard_normal((2, 4, 32, 59)) * mult, g.standard_normal((2, 4, T, 59)),
                      g.standard_normal((2, 4, T, 59)), g.standard_normal((2, 4, 32, 59)))
            logit = np.abs(np.einsum("bhid,bhjd->bhij", arrays[0], arrays[1])).max() / math.sqrt(59)
            rows.append([f"x{mult}", T, f"{logit:.0f}", *(f"{r:.1f}" for r in
                                                          _torch_ratios(arrays, "sdpa"))])
    report("attnkit.torch backend='sdpa' on CPU, float32: error / math path's error",
           ["q scale", "Tk", "max |logit|", "out", "dq", "dk", "dv"], rows,
           notes="B=2, H=4, Tq=32, Dk=Dv=59, random normal inputs, q scaled up. The rule "
                 "allows 2 / 5 / 3 / 3.", record=record)


def _plain32(q, k, v, do, causal):
    import torch

    q, k, v = (torch.from_numpy(x).float().requires_grad_(True) for x in (q, k, v))
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        T, S = s.shape[-2:]
        s = s.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(S - T), -math.inf)
    out = torch.softmax(s, -1) @ v
    out.backward(torch.from_numpy(do).float())
    return out.detach(), q.grad, k.grad, v.grad


def _ours(backend, q, k, v, do, causal):
    import torch

    f32 = [x.astype(np.float32) for x in (q, k, v, do)]
    if backend == "numpy flash":
        import attnkit.numpy as an

        out, back = an.vjp(an.flash_attention, *f32[:3], causal=causal, block_q=8, block_k=16)
        return (out, *back(f32[3]))
    t = [torch.from_numpy(x) for x in f32]
    if backend == "torch lse (ring block)":
        from attnkit.torch.lse import attention_with_lse, attention_with_lse_backward

        scale = 1 / math.sqrt(q.shape[-1])
        out, lse = attention_with_lse(*t[:3], causal=causal, scale=scale,
                                      lse_dtype=torch.float64)
        return (out, *attention_with_lse_backward(t[3], *t[:3], out, lse, causal=causal,
                                                  scale=scale))
    import attnkit.triton as tt

    leaves = [x.requires_grad_(True) for x in t[:3]]
    out = tt.flash_attention(*leaves, causal=causal)
    out.backward(t[3])
    return (out.detach(), *(x.grad for x in leaves))


def blockwise_table(record: bool) -> None:
    from attnkit.testing import large_logit_inputs, max_mean_error, reference_attention

    g = np.random.default_rng(1)
    cases = {
        "logits 1e4 (exact in float32), Tq=16, Tk=45": (large_logit_inputs(), False),
        "logits 1e4, causal, T=45": (large_logit_inputs(Tq=45, Tk=45), True),
        "q x20, Dk=59, Tk=45": ((g.standard_normal((1, 2, 16, 59)) * 20,
                                 g.standard_normal((1, 2, 45, 59)),
                                 g.standard_normal((1, 2, 45, 59)),
                                 g.standard_normal((1, 2, 16, 59))), False),
    }
    rows = []
    for case, (arrays, causal) in cases.items():
        ref = reference_attention(*arrays[:3], d_out=arrays[3], causal=causal)
        want = (ref.out, ref.dq, ref.dk, ref.dv)
        base = [max_mean_error(b, r)[0] for b, r in zip(_plain32(*arrays, causal), want)]
        for backend in ("numpy flash", "triton (interpreter)", "torch lse (ring block)"):
            got = _ours(backend, *arrays, causal)
            errs = [max_mean_error(x, r)[0] for x, r in zip(got, want)]
            rows.append([case, backend, *(f"{e:.1e} ({e / b:.1f}x)" for e, b in
                                          zip(errs, base))])
        rows.append([case, "plain float32 math", *(f"{b:.1e}" for b in base)])
    report("Blockwise attention in float32 at large logits: max error (x plain float32)",
           ["inputs", "backend", "out", "dq", "dk", "dv"], rows,
           notes="attnkit.testing.large_logit_inputs: dyadic q, k with a common component, "
                 "scale 1/8. Triton ran under TRITON_INTERPRET=1 (CPU).", record=record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="print only")
    parser.add_argument("--smoke", action="store_true", help="print only (as --quick)")
    args = parser.parse_args()
    args.quick = args.quick or args.smoke
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sdpa_table(not args.quick)
    blockwise_table(not args.quick)


if __name__ == "__main__":
    main()
