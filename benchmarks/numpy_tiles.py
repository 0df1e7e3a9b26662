"""Tile sizes of ``attnkit.numpy.flash_attention`` against torch's CPU SDPA.

The figures behind the default tile plan (``attnkit.numpy._plan``): for each T, every
tile size runs on the same float32 inputs (B=1, H=8, D=64, no mask) with the default
worker count, each call paired with a torch SDPA call in the same round (order
alternating, a short pause before each so that the other side's threads go idle;
``_measure.rounds``); the ratio is the median of the per-pair ratios after one warm-up.

Usage::

    python benchmarks/numpy_tiles.py           # T = 1024, 2048, 4096; records it (BENCHMARKS.md)
    python benchmarks/numpy_tiles.py --quick   # T = 512, prints only
    python benchmarks/numpy_tiles.py --smoke   # T = 256, one round: checks that it runs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from _measure import paired_ratio, rounds  # noqa: E402
from _report import report  # noqa: E402

import attnkit.numpy as an  # noqa: E402
from attnkit.numpy._plan import plan  # noqa: E402

TILES = ((128, 256), (256, 256), (256, 512), (512, 512))


def sweep(T: int, repeats: int) -> list[list[object]]:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 8, T, 64), dtype=np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))

    def torch_sdpa() -> None:
        with torch.no_grad():
            torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)

    ratios = {}
    for bq, bk in TILES:
        def tile(bq: int = bq, bk: int = bk) -> None:
            an.flash_attention(q, k, v, block_q=bq, block_k=bk)

        times = rounds({"tile": tile, "torch": torch_sdpa}, repeats, pause=0.05)[0]
        ratios[(bq, bk)] = paired_ratio(times, "tile", "torch")
    chosen = plan(T, T, None, None, None)
    return [[T, f"{bq}x{bk}", round(ratios[(bq, bk)], 3),
             "default" if (bq, bk) == (chosen.block_q, chosen.block_k) else ""]
            for bq, bk in TILES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="T = 512 only, do not record")
    parser.add_argument("--smoke", action="store_true",
                        help="T = 256, one round, do not record: checks that the script runs")
    args = parser.parse_args()
    sizes, repeats = (((256,), 1) if args.smoke else ((512,), 3) if args.quick
                      else ((1024, 2048, 4096), 7))
    rows = [row for T in sizes for row in sweep(T, repeats)]
    workers = plan(4096, 4096, None, None, None).threads
    report(
        "NumPy flash_attention tile sizes vs torch SDPA (CPU, float32)",
        ["T", "tile (queries x keys)", "vs torch", "picked by default"],
        rows,
        notes=(f"B=1, H=8, D=64, no mask; {workers} worker threads (the default); "
               f"median of {repeats} paired ratios after one warm-up; torch threads "
               f"{torch.get_num_threads()}. The machine is shared with other jobs: "
               "compare rows of one run."),
        record=not (args.quick or args.smoke),
    )


if __name__ == "__main__":
    main()
