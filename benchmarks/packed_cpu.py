"""Packed documents on the CPU: attnkit with ``segment_ids`` vs SDPA with the equivalent
dense mask, side by side in one run.

Eight documents of unequal lengths (512 to 1536 tokens) packed into T = 8192 positions,
B = 1, H = 8, D = 64, float32, one thread: forward, and forward+backward (loss =
``out.sum()``), without and with a causal mask. attnkit finds the documents' runs and runs
SDPA on each (:mod:`attnkit.torch._packed`), so its work is the sum of the documents'
squares (about 1/7 of T^2 here); SDPA with a dense ``(T, T)`` bool mask computes every
tile. Goal: >= 3x.

Usage::

    python benchmarks/packed_cpu.py           # T=8192, records it (BENCHMARKS.md)
    python benchmarks/packed_cpu.py --quick   # T=1024, prints only
    python benchmarks/packed_cpu.py --smoke   # T=256, one round: checks that it runs
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from _measure import paired_ratio, peak_mib, pin_malloc, rounds  # noqa: E402
from _report import report  # noqa: E402

import attnkit.torch as at  # noqa: E402

# Document lengths as fractions of T (in 1/16ths): 8 documents, sum 16/16.
SHARES = (1, 3, 1.5, 2.5, 2, 1.25, 2.75, 2)


def lengths_for(T: int) -> torch.Tensor:
    n = [int(T * s / 16) for s in SHARES]
    n[-1] += T - sum(n)
    return torch.tensor(n)


def bench(T: int, H: int, D: int, repeats: int, record: bool) -> None:
    torch.manual_seed(0)
    lengths = lengths_for(T)
    ids = at.segment_ids_from_lengths(lengths, T)  # (1, T)
    q, k, v = (torch.randn(1, H, T, D, requires_grad=True) for _ in range(3))
    rows = []
    for causal in (False, True):
        dense = at.attention_mask((1, H, T, T), segment_ids=ids, causal=causal)  # (1, 1, T, T)

        def ours(backward: bool, causal: bool = causal) -> None:
            out, _ = at.attention(q, k, v, segment_ids=ids, causal=causal)
            if backward:
                out.sum().backward()

        def sdpa(backward: bool, dense: torch.Tensor = dense) -> None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
            if backward:
                out.sum().backward()

        # Both agree before they are timed.
        with torch.no_grad():
            torch.testing.assert_close(at.attention(q, k, v, segment_ids=ids, causal=causal)[0],
                                       F.scaled_dot_product_attention(q, k, v, attn_mask=dense),
                                       atol=2e-5, rtol=1e-4)
        for backward in (False, True):
            def run_ours(b: bool = backward) -> None:
                if b:
                    ours(True)
                else:
                    with torch.no_grad():
                        ours(False)

            def run_sdpa(b: bool = backward) -> None:
                if b:
                    sdpa(True)
                else:
                    with torch.no_grad():
                        sdpa(False)

            times = rounds({"sdpa": run_sdpa, "ours": run_ours}, repeats)[0]
            rows.append([
                f"{'causal' if causal else 'full'}, {'fwd+bwd' if backward else 'fwd'}",
                *(f"{statistics.median(times[side]) * 1e3:.1f}" for side in ("sdpa", "ours")),
                round(paired_ratio(times, "sdpa", "ours"), 2),
                *(f"{peak_mib(fn):.1f}" for fn in (run_sdpa, run_ours)),
            ])
            q.grad = k.grad = v.grad = None
    work = float((lengths.double() ** 2).sum() / T**2)
    report(
        f"Packed documents, attnkit segment_ids vs SDPA with a dense mask (CPU, T={T}, "
        f"B=1, H={H}, D={D}, float32)",
        ["case", "SDPA+mask ms", "attnkit ms", "speed-up", "SDPA peak MiB", "attnkit peak MiB"],
        rows,
        notes=(
            f"Documents of lengths {lengths.tolist()} (sum of squares = {work:.3f} T^2). "
            f"{repeats} interleaved rounds after one warm-up (order alternating); times "
            "are medians, the speed-up the median of the per-round ratios; "
            f"torch intra-op threads: {torch.get_num_threads()}. SDPA gets the dense "
            "(1, 1, T, T) bool mask built once outside the timing; attnkit gets the (1, T) "
            "ids and reads their runs each call. Peak = rise of VmHWM over RSS before the "
            "call. The machine was shared with other jobs during the run."
        ),
        record=record,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="T=1024, print only (nothing recorded)")
    parser.add_argument("--smoke", action="store_true",
                        help="T=256, one round, print only: checks that the script runs")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pin_malloc()
    if args.smoke:
        bench(256, 2, 16, repeats=1, record=False)
    elif args.quick:
        bench(1024, 4, 32, repeats=2, record=False)
    else:
        bench(8192, 8, 64, repeats=3, record=True)


if __name__ == "__main__":
    main()
