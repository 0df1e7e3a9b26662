"""NumPy reference attention on the CPU vs ``torch.nn.functional.scaled_dot_product_attention``.

Compares ``attnkit.numpy.scaled_dot_product_attention`` and ``attnkit.numpy.flash_attention``
with PyTorch's CPU SDPA on the same float32 inputs (B=1, H=8, D=64, no mask), in one run:
time, the ratio to torch, and peak memory.

Each (numpy op, T) pair runs in a fresh subprocess, one at a time, so the multi-GB score
arrays of the NumPy SDPA at large T never coexist with anything else. In that process:

* time: after warm-up, the NumPy op and torch are called alternately (order swapped every
  round, a short pause between calls so torch's OpenMP threads stop spinning); the ratio
  is the median of the per-round ratios, so both sides of a ratio saw the same load on a
  shared machine;
* memory: glibc's mmap threshold is pinned at 64 KiB and the heap trimmed, so freed
  temporaries leave RSS instead of being cached in the heap (which would hide them); after
  a warm-up call the kernel's peak-RSS counter is reset (``/proc/self/clear_refs``) and
  the growth of ``VmHWM`` over the RSS before one call is the peak extra memory of that
  call. RSS counts every allocator alike (NumPy, torch/oneDNN, BLAS), so it is the fair
  comparison; for the NumPy ops ``tracemalloc`` (NumPy's own allocations) is reported too.

Attention FLOPs (forward, no mask): ``4 * B * H * T * T * D``.

Usage::

    python benchmarks/numpy_cpu.py            # T = 1024, 4096, 8192; records it (BENCHMARKS.md)
    python benchmarks/numpy_cpu.py --quick    # small sizes, prints only
    python benchmarks/numpy_cpu.py --threads 1 --sizes 1024 4096   # steadier ratios
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import median_time, report  # noqa: E402

B, H, D = 1, 8, 64
NAMES = {"torch": "torch SDPA (CPU)", "sdpa": "numpy SDPA", "flash": "numpy flash"}


# --- worker side (runs in the subprocess) -----------------------------------------------


def _inputs(T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)  # same seed in every process: the same inputs
    return tuple(rng.standard_normal((B, H, T, D), dtype=np.float32) for _ in range(3))


def _threads() -> int | None:
    """``--threads N`` of the parent, passed down through the environment (None: defaults)."""
    value = os.environ.get("ATTNKIT_BENCH_THREADS")
    return int(value) if value else None


def _op(name: str, T: int):
    q, k, v = _inputs(T)
    threads = _threads()
    if name == "torch":
        import torch

        if threads is not None:
            torch.set_num_threads(threads)

        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))  # shares memory, no copy

        def run() -> np.ndarray:
            with torch.no_grad():
                return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv).numpy()

        return run, f"torch threads {torch.get_num_threads()}"

    import attnkit.numpy as an

    if name == "sdpa":
        blas = "default" if threads is None else threads
        return (lambda: an.scaled_dot_product_attention(q, k, v)[0]), f"BLAS threads {blas}"
    from attnkit.numpy._plan import plan

    if threads is not None:
        chosen = plan(T, T, None, None, threads)
        return (lambda: an.flash_attention(q, k, v, num_threads=threads)), (
            f"num_threads={threads} (tiles {chosen.block_q}x{chosen.block_k}, BLAS at one "
            "thread per worker)"
        )

    # No arguments: the tiles and threads flash_attention picks for this machine.
    chosen = plan(T, T, None, None, None)
    return (lambda: an.flash_attention(q, k, v)), (
        f"defaults, called with no arguments (picked: {chosen.threads} threads, "
        f"{chosen.block_q}x{chosen.block_k} tiles, BLAS limited to one thread per worker by "
        "threadpoolctl)"
    )


def _status(field: str) -> int:
    """A ``/proc/self/status`` memory field in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _release_freed_memory() -> None:
    """Make glibc return freed blocks to the kernel from now on, and trim the heap now."""
    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)  # also stops the threshold from adapting
    libc.mallopt(M_TRIM_THRESHOLD, 64 * 1024)
    libc.malloc_trim(0)


def _peak_rss(fn) -> int:
    """Peak RSS growth (bytes) during one call of ``fn``."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM (peak RSS) to the current RSS
    before = _status("VmRSS")
    out = fn()
    peak = _status("VmHWM") - before
    del out
    return peak


def worker(name: str, T: int, repeats: int) -> None:
    ours, config = _op(name, T)
    theirs, torch_config = _op("torch", T)
    result: dict[str, object] = {"config": config, "torch_config": torch_config}
    result["max_err"] = float(np.abs(ours() - theirs()).max())  # also the first warm-up

    times: dict[str, list[float]] = {"ours": [], "torch": []}
    for r in range(repeats + 1):  # round 0 is one more warm-up
        pair = [("ours", ours), ("torch", theirs)]
        for side, fn in pair if r % 2 else pair[::-1]:
            time.sleep(0.05)  # let the other side's worker threads go idle
            t = median_time(fn, repeats=1, warmup=0)
            if r:
                times[side].append(t)
    result["time_s"] = statistics.median(times["ours"])
    result["torch_time_s"] = statistics.median(times["torch"])
    result["ratio"] = statistics.median(a / b for a, b in zip(times["ours"], times["torch"]))

    _release_freed_memory()
    for side, fn in (("torch", theirs), ("ours", ours)):
        fn()  # warm-up under the new allocator settings
        result[f"{side}_rss_peak_bytes"] = _peak_rss(fn)
    tracemalloc.start()
    ours()
    result["tracemalloc_peak_bytes"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print("RESULT " + json.dumps(result))


# --- parent side ------------------------------------------------------------------------


def _env(threads: int | None) -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    if threads is not None:
        env["ATTNKIT_BENCH_THREADS"] = str(threads)
        # BLAS and OpenMP pools sized before NumPy and torch start
        env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = str(threads)
    return env


def _run_case(name: str, T: int, repeats: int, threads: int | None) -> dict:
    cmd = [sys.executable, __file__, "--worker", name, str(T), str(repeats)]
    proc = subprocess.run(cmd, env=_env(threads), capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {proc.returncode}: {' | '.join(tail)}"}


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, do not record")
    parser.add_argument("--smoke", action="store_true",
                        help="T=128, one round, do not record: checks that the script runs")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for every side (torch, BLAS, flash workers); "
                             "default: each library's own choice")
    parser.add_argument("--sizes", type=int, nargs="+", default=None,
                        help="sequence lengths T (default 1024 4096 8192)")
    parser.add_argument("--ops", nargs="+", choices=("flash", "sdpa"), default=("flash", "sdpa"),
                        help="NumPy ops to time against torch (default both)")
    args = parser.parse_args()
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be a positive integer, got {args.threads}")
    sizes = args.sizes or ((128,) if args.smoke else (256, 512) if args.quick
                           else (1024, 4096, 8192))
    args.quick = args.quick or args.smoke
    mib = 2.0**20
    rows, configs, skipped, errors = [], {}, [], []
    ratio_4096, flash_mem = None, {}
    load_before = os.getloadavg()[0]
    for T in sizes:
        repeats = 1 if args.smoke else 3 if (args.quick or T >= 8192) else 5
        for name in args.ops:
            # The NumPy SDPA holds ~4 float32 (H, T, T) arrays at once; do not run it
            # where it would push the shared machine into swap or the OOM killer.
            need = 5 * B * H * T * T * 4
            if name == "sdpa" and need > 0.6 * _mem_available():
                skipped.append(
                    f"numpy SDPA at T={T} skipped: needs ~{need / 2**30:.0f} GiB, "
                    f"{_mem_available() / 2**30:.0f} GiB available"
                )
                continue
            res = _run_case(name, T, repeats, args.threads)
            if "error" in res:
                errors.append(f"{NAMES[name]} at T={T}: {res['error']}")
                continue
            configs[name], configs["torch"] = res["config"], res["torch_config"]
            t, tm = res["time_s"], res["tracemalloc_peak_bytes"]
            rows.append([
                T, NAMES[name], t * 1e3, res["torch_time_s"] * 1e3, res["ratio"],
                4 * B * H * T * T * D / t / 1e9, res["ours_rss_peak_bytes"] / mib,
                res["torch_rss_peak_bytes"] / mib, tm / mib, f"{res['max_err']:.1e}",
            ])
            if name == "flash":
                flash_mem[T] = res["ours_rss_peak_bytes"]
                if T == 4096:
                    ratio_4096 = res["ratio"]

    load = f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    rounds = "3" if args.quick else "5 (3 at T=8192)"
    notes = [
        f"B={B}, H={H}, D={D}, float32, no mask. torch: {configs.get('torch', '?')}. "
        + "; ".join(f"{NAMES[name]}: {configs[name]}" for name in args.ops if name in configs)
        + ".",
        f"time: median of {rounds} rounds after warm-up; in each round the NumPy op and "
        "torch run back to back in the same process (order alternating); vs torch = median "
        "of the per-round ratios. torch (ms) is torch's median in that same process.",
        "peak RSS: growth of VmHWM over VmRSS during one call after warm-up (fresh process "
        "per NumPy op and T; glibc mmap threshold pinned at 64 KiB and heap trimmed first, so "
        "freed blocks leave RSS); counts every allocator alike, torch included, so it is the "
        "fair comparison (the kernel's counters are exact to ~1 MiB). tracemalloc: NumPy's "
        "own allocations only.",
        "max |err|: largest difference from torch's output over the whole output.",
        f"The machine is shared with other jobs ({os.cpu_count()} cores, 1-min load average "
        f"{load}): absolute times are noisy; the paired ratios are the figures to read. "
        "Under such load the default multi-threaded OpenBLAS makes the NumPy SDPA erratic "
        "at small T (T=256: 21 ms with OPENBLAS_NUM_THREADS=1 vs 33-620 ms default, "
        "measured separately).",
    ]
    if ratio_4096 is not None:
        verdict = "met" if ratio_4096 <= 1.5 else "NOT met"
        notes.append(f"Goal flash <= 1.5x torch at T=4096: {ratio_4096:.2f}x ({verdict}).")
    if len(flash_mem) >= 2:
        (t0, m0), (t1, m1) = min(flash_mem.items()), max(flash_mem.items())
        notes.append(
            f"flash peak RSS grows {m1 / max(m0, 1):.1f}x for {t1 // t0}x T (linear in T: the "
            f"output, a K^T copy and per-thread tiles; one H x T x T float32 score array at "
            f"T={t1} would be {H * t1 * t1 * 4 / mib:.0f} MiB)."
        )
    notes += skipped + errors
    report(
        "NumPy attention on the CPU vs torch SDPA (float32)",
        ["T", "op", "time (ms)", "torch (ms)", "vs torch", "GFLOP/s", "peak RSS (MiB)",
         "torch peak RSS (MiB)", "tracemalloc (MiB)", "max |err|"],
        rows,
        notes="\n".join(f"- {n}" for n in notes),
        record=not args.quick,
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _, _, op_name, t_arg, rep_arg = sys.argv
        worker(op_name, int(t_arg), int(rep_arg))
    else:
        main()
