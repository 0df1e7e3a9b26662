"""Reproducers for the oracle findings of ``check_multi_head``: a few lines that build the
module as the check did, capture what its own projections produced with forward hooks,
compute ``softmax(q k^T / sqrt(d)) v`` from them in float64 and fail where the module's
attention core differs; or, for tokens mixed across the batch, change one example and watch
another."""

from __future__ import annotations

from typing import Any

from ..catalogue import Text
from ..core.repro import note, said
from .structure import Candidate, Capture

__all__ = ["batch_mixing_repro", "core_repro"]


def batch_mixing_repro(h: Any) -> Text:
    """Change example 1 only; example 0's output must not move."""
    return h.repro([
        "y = x.clone()",
        "y[1] += 2 * torch.randn(y.shape[1:], generator=torch.Generator().manual_seed(1))",
        "with torch.no_grad():",
        f"    a, b = run({h.args_text('x')}), run({h.args_text('y')})",
        "assert torch.allclose(a[0], b[0], atol=1e-5), " + said("repro.example0-moved")])


def _bf(cap: Capture, i: int, out: bool) -> str:
    """``.transpose(0, 1)`` when linear ``i``'s tensor is sequence-first."""
    c = cap.linears[i]
    t = c.out if out else c.args[0]
    Bn, T = cap.xq.shape[:2]
    return ".transpose(0, 1)" if t.dim() == 3 and tuple(t.shape[:2]) == (T, Bn) else ""


def core_repro(h: Any, cap: Capture, cand: Candidate, o_index: int | None,
               causal: bool) -> Text:
    """The module's attention core against the float64 formula on its own q, k, v."""
    Bn, T = cap.xq.shape[:2]
    used = sorted({i for i, _, _ in cand.parts} | ({o_index} if o_index is not None else set()))
    names = {i: cap.linears[i].name for i in used}
    lines: list = [
        "seen = {}", "",
        "def keep(name):",
        "    def hook(mod, args, out):",
        "        seen[name] = (args[0].detach().double(), out.detach().double())",
        "    return hook", "",
        f"for name in {[names[i] for i in used]!r}:",
        "    m.get_submodule(name).register_forward_hook(keep(name))",
        "with torch.no_grad():",
        f"    out = run({h.args_text('x', 'kv')})" if not h.self_only else "    out = run(x)",
        f"B, T, H, Hkv, d, dv = {Bn}, {T}, {cand.H}, {cand.Hkv}, {cand.d}, {cand.dv}",
    ]
    if not h.self_only:
        lines.insert(0, f"kv = torch.randn({Bn}, {T}, x.shape[-1], "
                        f"generator=torch.Generator().manual_seed(1))")
    for role, (i, first, width), n, dim in zip("qkv", cand.parts, ("H", "Hkv", "Hkv"),
                                               ("d", "d", "dv")):
        src = f"seen[{names[i]!r}][1]{_bf(cap, i, True)}"
        if cand.interleave:
            lines.append(f"{role} = {src}.reshape(B, T, {n}, 3, {dim})[:, :, :, "
                         f"{first // cand.d}].transpose(1, 2)")
        elif cand.layout == "hd":
            lines.append(f"{role} = {src}[..., {first}:{first + width}].reshape(B, T, {n}, "
                         f"{dim}).transpose(1, 2)")
        else:
            lines.append(f"{role} = {src}[..., {first}:{first + width}].reshape(B, T, {dim}, "
                         f"{n}).permute(0, 3, 1, 2)")
    lines += ["k, v = k.repeat(1, H // Hkv, 1, 1), v.repeat(1, H // Hkv, 1, 1)" if cand.cycle
              else "k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)",
              "scores = q @ k.transpose(-2, -1) / d ** 0.5"]
    if causal:
        lines.append("scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool)"
                     ".tril(), float('-inf'))")
    merge = ("transpose(1, 2).reshape(B, T, H * dv)" if cand.layout == "hd" else
             "permute(0, 2, 3, 1).reshape(B, T, dv * H)")
    lines.append(f"want = (scores.softmax(-1) @ v).{merge}  # float64")
    got = (f"seen[{names[o_index]!r}][0]{_bf(cap, o_index, False)}" if o_index is not None
           else "out.double()")
    lines += [note(f"got = {got}", "repro.core-reads"),
              "err = (got - want).abs().max().item()",
              "print(f" + said("repro.core-off", err="{err:.3g}") + ")",
              "assert err < 1e-4, " + said("repro.core-differs")]
    return h.repro(lines)
