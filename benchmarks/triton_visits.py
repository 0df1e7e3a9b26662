"""Key blocks the fused forward kernel visits for packed documents, against a dense pass.

With ``segment_ids`` each query block of ``attnkit.triton.flash_attention`` loops only over
the key blocks that hold its own documents (the rest are skipped, not masked). This counts
the blocks the kernel actually visits (a ``COUNT_VISITS`` build of the forward kernel,
:func:`attnkit.triton.flash.key_block_visits`) for D equal documents packed into one
sequence, with and without causal, and for documents that straddle block edges.

It is a count, not a timing: the ratio is what a GPU run saves in score tiles (about
``1/D`` for D equal documents, plus the straddling blocks). It runs on a GPU with the
tuned tiles, or on the CPU under ``TRITON_INTERPRET=1`` (set here when there is no GPU)
with the interpreter's 16 x 16 tiles; the tile sizes used are printed. Timings of the
variants on a GPU are in ``benchmarks/triton_gpu.py``.

    python benchmarks/triton_visits.py            # records it (BENCHMARKS.md)
    python benchmarks/triton_visits.py --quick    # prints only
    python benchmarks/triton_visits.py --smoke    # one size, prints only: checks that it runs
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported

from _report import report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-record", action="store_true", help="print only")
    parser.add_argument("--quick", action="store_true", help="print only (the sizes are small)")
    parser.add_argument("--smoke", action="store_true",
                        help="one size, print only: checks that the script runs")
    args = parser.parse_args(argv)
    from attnkit.triton.flash import key_block_visits

    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    dtype = torch.bfloat16 if gpu else torch.float32
    # (documents, document length): tile-aligned, and straddling the 16-wide CPU tiles.
    points = [(8, 1024), (32, 256), (8, 1000)] if gpu else [(8, 16), (8, 17), (8, 61)]
    if args.smoke:
        points = points[1:2]
    rows = []
    for docs, length in points:
        T = docs * length
        ids = (torch.arange(T, device=device) // length)[None, :]
        q = torch.randn(1, 1, T, 64 if gpu else 16, device=device, dtype=dtype)
        for causal in (False, True):
            visited, total = key_block_visits(q, q, q, segment_ids=ids, causal=causal)
            dense, _ = key_block_visits(q, q, q, causal=causal)
            rows.append([docs, length, T, "causal" if causal else "full", total, dense, visited,
                         f"{visited / dense:.3f}", f"{visited / total:.3f}", f"{1 / docs:.3f}"])
    tiles = "tuned (autotune picks per shape)" if gpu else "16 x 16 (interpreter)"
    report(
        "attnkit.triton packed documents: key blocks the forward kernel visits",
        ["docs", "doc len", "T", "mask", "all blocks", "dense visits", "segment visits",
         "vs dense", "vs all", "1/docs"],
        rows,
        notes=(f"Tiles: {tiles}. 'all blocks' = query blocks x key blocks; 'dense visits' "
               "= what the kernel visits for the same mask without segment ids (causal "
               "already skips blocks above the diagonal). A count from the kernel itself "
               "(COUNT_VISITS build), not a timing; GPU timings of the variants are pending "
               "(benchmarks/triton_gpu.py)."),
        record=not (args.no_record or args.quick or args.smoke),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
