"""Ring attention: work per rank (zigzag vs contiguous), bytes per step, and CPU/gloo timing.

    python benchmarks/ring.py            # real sizes, records it (BENCHMARKS.md)
    python benchmarks/ring.py --quick    # small sizes, prints only

Three tables:

1. Causal forward FLOPs per rank over one ring pass, computed from the block schedule the
   ring executes (``attnkit.distributed.step_blocks``): ``4*B*H*D`` per allowed
   (query, key) pair. Because every ring step waits for the K/V block of the previous
   rank, the time of a pass follows the *critical path*: the sum over steps of the busiest
   rank's work in that step. Both are given relative to a perfectly even split.
2. Bytes each rank sends per ring step (forward: K and V in the input dtype; backward:
   K and V again plus dK and dV accumulated in float32), and the per-step compute at
   H100 rates, for a long-context GQA configuration.
3. Measured on this CPU with gloo: ring attention forward+backward on 2 processes
   (1 thread each) against one process running the same kernels on the whole sequence
   (1 and 2 threads), at a length where compute dominates communication.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import report  # noqa: E402

from attnkit.distributed import (  # noqa: E402
    flops_per_rank,
    num_chunks,
    ring_attention,
    shard_sequence,
    step_blocks,
)

# Published rates (see docs/distributed.md for sources) and the fractions assumed achieved.
H100_BF16_DENSE = 989e12  # FLOP/s, H100 SXM dense BF16 tensor core peak
NVLINK4_PER_DIR = 450e9  # B/s, H100 SXM NVLink 4: 900 GB/s total = 450 GB/s each way
PCIE5_X16_PER_DIR = 64e9  # B/s, PCIe 5.0 x16 (32 GT/s x 16 lanes, 128b/130b ~ 63 GB/s)
COMPUTE_EFF, LINK_EFF = 0.5, 0.8


def critical_path(layout: str, P: int, T: int, *, causal: bool) -> tuple[int, int]:
    """``(busiest rank's pairs, sum over steps of the busiest rank's pairs in that step)``."""
    c = T // num_chunks(layout, P)
    per_rank = [0] * P
    path = 0
    for s in range(P):
        step = [
            sum(b.pairs() for b in step_blocks(layout, P, r, (r - s) % P, c, causal=causal))
            for r in range(P)
        ]
        path += max(step)
        per_rank = [a + b for a, b in zip(per_rank, step)]
    return max(per_rank), path


def work_table(quick: bool) -> list[list[object]]:
    T, B, H, D = (4096, 1, 8, 64) if quick else (131072, 1, 32, 128)
    rows = []
    for P in (2, 4, 8) if quick else (2, 4, 8, 16, 32):
        for layout in ("zigzag", "contiguous"):
            f = flops_per_rank(layout, P, T, causal=True, batch=B, heads=H, head_dim=D)
            even = sum(f) / P
            busiest, path = critical_path(layout, P, T, causal=True)
            per_pair = 4 * B * H * D
            rows.append([
                P, layout, f"{max(f) / 1e12:.4g}", f"{min(f) / 1e12:.4g}",
                f"{(max(f) - min(f)) / max(f) * 100:.2f}%",
                f"{busiest * per_pair / even:.3f}", f"{path * per_pair / even:.3f}",
            ])
    return rows


def bytes_table(quick: bool) -> tuple[list[list[object]], str]:
    B, H, Hkv, D, b = 1, 32, 8, 128, 2  # a Llama-style GQA layer in bf16
    rows = []
    for T in (32768, 131072) if quick else (32768, 131072, 524288, 1048576):
        for P in (4, 8):
            L = T // P
            fwd = 2 * B * Hkv * L * D * b  # K and V
            bwd = 2 * B * Hkv * L * D * (b + 4)  # K, V and float32 dK, dV
            pairs = L * L / 2  # a causal zigzag step: 2c^2 pairs with c = L/2
            t_fwd = 4 * B * H * D * pairs / (H100_BF16_DENSE * COMPUTE_EFF)
            t_nv = fwd / (NVLINK4_PER_DIR * LINK_EFF)
            t_pcie = fwd / (PCIE5_X16_PER_DIR * LINK_EFF)
            rows.append([
                T, P, L, f"{fwd / 2**20:.1f}", f"{bwd / 2**20:.1f}", f"{t_fwd * 1e6:.0f}",
                f"{t_nv * 1e6:.0f}", f"{t_pcie * 1e6:.0f}",
                "yes" if t_nv <= t_fwd else "no", "yes" if t_pcie <= t_fwd else "no",
            ])
    notes = (
        f"B={B}, H={H}, Hkv={Hkv}, D={D}, bf16, causal, zigzag; per step one K/V shard of "
        f"T/P tokens goes to the next rank. Compute time at {COMPUTE_EFF:.0%} of "
        f"{H100_BF16_DENSE / 1e12:.0f} TFLOP/s; link time at {LINK_EFF:.0%} of NVLink 4 "
        f"{NVLINK4_PER_DIR / 1e9:.0f} GB/s or PCIe 5.0 x16 {PCIE5_X16_PER_DIR / 1e9:.0f} GB/s "
        "per direction (published rates; docs/distributed.md has the derivation). "
        "Communication hides when the link time is below the compute time (forward; the "
        "backward sends 3x the bytes for 2.5x the compute)."
    )
    return rows, notes


# ---- CPU timing ---------------------------------------------------------------------------

def _inputs(T: int, B: int, H: int, D: int):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, T, D, generator=gen) for _ in range(4)]  # q, k, v, dout


def _fwd_bwd(q, k, v, dout, **kw) -> None:
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    out = ring_attention(*leaves, **kw)
    out.backward(dout)


def _ring_worker(rank: int, world: int, init: str, cfg: dict, out_path: str) -> None:
    """Time the ring variants and, in the same rounds, one process on the whole sequence.

    Rounds interleave ring passes and single-process passes so that both see the same
    machine load (this machine is shared). During a single-process pass rank 0 works
    alone; the other rank blocks in a barrier, which costs no CPU.
    """
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    # One process on the whole sequence = ring_attention on a group of one rank (no
    # communication); every rank must take part in creating it.
    solo = dist.new_group([0])
    full = _inputs(cfg["T"], cfg["B"], cfg["H"], cfg["D"])
    variants = cfg["variants"]
    shards = {
        name: [shard_sequence(t, layout=kw["layout"]) for t in full]
        for name, kw in variants.items()
    }
    times: dict[str, list[float]] = {}
    for _ in range(cfg["warmup"] + cfg["repeats"]):
        for name, kw in variants.items():
            dist.barrier()
            t0 = time.perf_counter()
            _fwd_bwd(*shards[name], **kw)
            dist.barrier()  # the pass ends when the slowest rank is done
            times.setdefault(name, []).append(time.perf_counter() - t0)
        for threads in (1, 2):
            for causal in (True, False):
                if rank == 0:
                    torch.set_num_threads(threads)
                    t0 = time.perf_counter()
                    _fwd_bwd(*full, causal=causal, group=solo)
                    times.setdefault(f"single{threads}-{causal}", []).append(
                        time.perf_counter() - t0
                    )
                    torch.set_num_threads(1)
                dist.barrier()
    if rank == 0:
        results = {k: statistics.median(v[cfg["warmup"]:]) for k, v in times.items()}
        Path(out_path).write_text(json.dumps(results))
    dist.destroy_process_group()


def _run_ring(cfg: dict, world: int = 2, timeout: float = 900.0) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "ring.json")
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        ctx = mp.start_processes(_ring_worker, args=(world, init, cfg, out_path), nprocs=world,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=1.0):  # raises if a rank failed
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise TimeoutError(f"ring benchmark ranks still running after {timeout:.0f} s")
        return json.loads(Path(out_path).read_text())


def timing_table(quick: bool) -> tuple[list[list[object]], str]:
    T, B, H, D = (1024, 1, 4, 64) if quick else (4096, 1, 8, 64)
    warmup, repeats = (1, 1) if quick else (1, 3)
    variants = {
        "causal, zigzag": dict(causal=True, layout="zigzag"),
        "causal, contiguous": dict(causal=True, layout="contiguous"),
        "full, zigzag": dict(causal=False, layout="zigzag"),
    }
    cfg = dict(T=T, B=B, H=H, D=D, warmup=warmup, repeats=repeats, variants=variants)
    res = _run_ring(cfg, timeout=180.0 if quick else 1500.0)
    rows = []
    for name, kw in variants.items():
        s1, s2 = res[f"single1-{kw['causal']}"], res[f"single2-{kw['causal']}"]
        t = res[name]
        rows.append([name, f"{t:.3f}", f"{s1:.3f}", f"{s1 / t:.2f}x", f"{s2:.3f}",
                     f"{s2 / t:.2f}x"])
    flops = 3.5 * 4 * B * H * T * T * D  # forward + backward (2.5x) of full attention
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    notes = (
        f"T={T}, B={B}, H={H}, D={D}, float32, forward+backward, median of {repeats} after "
        f"{warmup} warm-up, ring and one-process passes interleaved in each round so both see "
        f"the same machine load; {flops / 1e9:.0f} GFLOP for full attention (half for causal). "
        "Ring: 2 gloo processes with 1 thread each (a pass ends at a barrier after the slowest "
        "rank). One process: ring_attention on the whole sequence (same torch block kernel). "
        "Speedup = one-process 1-thread time / ring time (ideal 2x: each rank does half the "
        "work on its own core). The 2-thread one-process column uses torch intra-op threads "
        "on the same two cores (many small tiled ops, each a fork/join of 2 threads), which "
        "suffers most from other load on a shared machine. Per step each rank sends "
        f"{2 * B * H * (T // 2) * D * 4 / 2**20:.0f} MiB of K/V. Machine load average at the "
        f"end: {load:.1f} (shared machine)."
    )
    return rows, notes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, print only")
    ap.add_argument("--smoke", action="store_true", help="as --quick")
    args = ap.parse_args()
    args.quick = args.quick or args.smoke
    record = not args.quick

    T, H, D = (4096, 8, 64) if args.quick else (131072, 32, 128)
    report(
        "Ring attention: causal work per rank, zigzag vs contiguous",
        ["P", "layout", "max TFLOP/rank", "min TFLOP/rank", "spread", "busiest/even",
         "critical path/even"],
        work_table(args.quick),
        notes=(
            f"T={T}, B=1, H={H}, D={D}, causal forward, 4*B*H*D FLOPs per allowed pair, "
            "counted from the block schedule the ring runs (attnkit.distributed.step_blocks). "
            "spread = (max - min) / max over ranks. critical path = sum over ring steps of "
            "the busiest rank's work in that step (each step waits for the previous rank's "
            "K/V), relative to total work / P: the pass takes at least this long."
        ),
        record=record,
    )
    rows, notes = bytes_table(args.quick)
    report(
        "Ring attention: bytes sent per rank per step, and per-step time at H100 rates",
        ["T", "P", "T/P", "fwd MiB/step", "bwd MiB/step", "fwd compute us", "NVLink us",
         "PCIe us", "hidden NVLink", "hidden PCIe"],
        rows, notes=notes, record=record,
    )
    rows, notes = timing_table(args.quick)
    report(
        "Ring attention on CPU with gloo: 2 processes vs one process",
        ["variant", "ring 2x1 thread s", "1 proc 1 thread s", "speedup (ideal 2x)",
         "1 proc 2 threads s", "ring vs 2 threads"],
        rows, notes=notes, record=record,
    )


if __name__ == "__main__":
    main()
