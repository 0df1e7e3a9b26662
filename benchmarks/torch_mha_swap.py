"""nn.TransformerEncoder before and after ``attnkit.torch.swap_attention``, side by side.

One model is built, deep-copied, and the copy's ``nn.MultiheadAttention`` layers are
swapped for ``attnkit.torch.MultiheadAttention`` (same parameters). Both run forward +
backward in training mode (where ``nn.TransformerEncoderLayer`` has no fused fast path, so
``self_attn.forward`` runs) on the same inputs, in three cases: no mask, a bool
``src_key_padding_mask`` (each sequence padded by a different amount, up to a quarter),
and a causal ``mask`` with ``is_causal=True``. Goal: ratio <= 1.0.

Usage::

    python benchmarks/torch_mha_swap.py            # 6 layers, B=8, T=512, E=512, H=8
    python benchmarks/torch_mha_swap.py --quick    # small sizes, prints only
    python benchmarks/torch_mha_swap.py --smoke    # 1 layer, T=32, one round: checks it runs
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from _measure import paired_ratio, peak_mib, pin_malloc, rounds  # noqa: E402
from _report import report  # noqa: E402

import attnkit.torch as at  # noqa: E402


def encoder_pair(layers: int, E: int, H: int, dropout: float) -> tuple[nn.Module, nn.Module]:
    """``nn.TransformerEncoder`` (dim_feedforward 4E, batch-first) and a swapped copy."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(E, H, 4 * E, dropout=dropout, batch_first=True)
    original = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).train()
    swapped = copy.deepcopy(original)
    replaced = at.swap_attention(swapped)
    assert len(replaced) == layers
    return original, swapped


def cases(B: int, T: int) -> dict[str, dict]:
    """The encoder's keyword arguments for each case."""
    kpm = torch.zeros(B, T, dtype=torch.bool)
    for b in range(B):
        kpm[b, T - (b * T) // (4 * max(B - 1, 1)):] = True  # 0 .. T/4 padded positions
    causal = nn.Transformer.generate_square_subsequent_mask(T)
    return {
        "no mask": {},
        "key_padding_mask": {"src_key_padding_mask": kpm},
        "causal mask, is_causal=True": {"mask": causal, "is_causal": True},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, nothing recorded")
    p.add_argument("--smoke", action="store_true",
                   help="1 layer, T=32, one round, nothing recorded: checks that it runs")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--T", type=int, default=512)
    p.add_argument("--E", type=int, default=512)
    p.add_argument("--H", type=int, default=8)
    p.add_argument("--dropout", type=float, default=0.0,
                   help="the layers' dropout (0: runs are deterministic and comparable)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-record", action="store_true", help="print only")
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.B, args.T, args.E, args.repeats = 2, 2, 128, 128, 3
    if args.smoke:
        args.layers, args.B, args.T, args.E, args.H, args.repeats = 1, 2, 32, 32, 4, 1
    torch.set_num_threads(args.threads)
    pin_malloc()
    original, swapped = encoder_pair(args.layers, args.E, args.H, args.dropout)
    x = torch.randn(args.B, args.T, args.E, requires_grad=True)

    rows = []
    for name, kwargs in cases(args.B, args.T).items():
        def step(model: nn.Module, kwargs: dict = kwargs) -> torch.Tensor:
            model.zero_grad(set_to_none=True)
            out = model(x, **kwargs)
            out.sum().backward()
            return out.detach()

        diff = float((step(original) - step(swapped)).abs().max())
        times = rounds({"torch": lambda: step(original), "ours": lambda: step(swapped)},
                       args.repeats)[0]
        rows.append([name,
                     *(f"{statistics.median(times[side]) * 1e3:.1f}" for side in ("torch", "ours")),
                     round(paired_ratio(times, "ours", "torch"), 3),
                     *(f"{peak_mib(lambda m=m: step(m)):.1f}" for m in (original, swapped)),
                     f"{diff:.1e}"])
    cfg = (f"{args.layers} layers, B={args.B} T={args.T} E={args.E} H={args.H}, "
           f"dropout={args.dropout}")
    report(
        f"nn.TransformerEncoder, nn.MultiheadAttention vs attnkit swap_attention, "
        f"forward+backward, training mode (CPU, {cfg})",
        ["case", "torch ms", "swapped ms", "ratio", "torch peak MiB", "swapped peak MiB",
         "max abs diff"],
        rows,
        notes=(
            f"float32, dim_feedforward={4 * args.E}, batch_first=True; loss = out.sum(). "
            f"{args.repeats} interleaved rounds after one warm-up (order alternating); times "
            "are medians, the ratio the median of the per-round ratios; same parameters "
            "and inputs. Peak = rise of VmHWM over RSS before the call. The encoder "
            "canonicalises masks to float before its layers, so both models see the same "
            "additive masks. torch intra-op threads: "
            f"{torch.get_num_threads()}. The machine was shared with other jobs during the run."
        ),
        record=not (args.quick or args.smoke or args.no_record),
    )


if __name__ == "__main__":
    main()
