"""Timing and memory helpers shared by the CPU benchmarks.

- :func:`rounds` interleaves the calls (the order alternating between rounds) so that load
  on a shared machine hits every side alike; :func:`paired_ratio` takes the median of the
  per-round ratios, so a drift in load between rounds cancels in each pair.
- :func:`pin_malloc` and :func:`peak_mib` read peak memory: glibc's mmap threshold pinned
  (freed tensors go back to the OS, so the resident size tracks live memory), then the
  rise of the kernel's peak-RSS counter during one call. Pinning makes every allocation
  over 128 KiB a fresh mmap with page faults, so time with glibc's defaults first.
"""

from __future__ import annotations

import ctypes
import gc
import statistics
import time
from collections.abc import Callable, Sequence

MiB = 2**20

Clock = Callable[[], float]


def rounds(
    fns: dict[str, Callable[[], object]], repeats: int,
    clocks: Sequence[Clock] = (time.perf_counter,), pause: float = 0.0,
) -> list[dict[str, list[float]]]:
    """Seconds of each call of each function per round, one dict per clock (e.g.
    ``time.process_time`` beside wall time); one warm-up call each. ``pause`` seconds of
    sleep (untimed) before each call let the previous call's worker threads go idle."""
    for fn in fns.values():
        fn()
    times: list[dict[str, list[float]]] = [{name: [] for name in fns} for _ in clocks]
    for r in range(repeats):
        order = list(fns.items())
        for name, fn in order if r % 2 == 0 else order[::-1]:  # neither side always first
            if pause:
                time.sleep(pause)
            starts = [clock() for clock in clocks]
            fn()
            for t, clock, t0 in zip(times, clocks, starts):
                t[name].append(clock() - t0)
    return times


def paired_ratio(times: dict[str, list[float]], ours: str, peer: str) -> float:
    """Median over rounds of ``ours / peer`` within each round."""
    return statistics.median(a / b for a, b in zip(times[ours], times[peer]))


def pin_malloc() -> bool:
    """Make glibc return freed memory to the OS from now on (a fixed 128 KiB mmap and trim
    threshold) and trim what the heap holds now. False where that is not possible."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        pinned = bool(libc.mallopt(-3, 128 * 1024))  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD: hand freed heap tops back too
        libc.malloc_trim(0)
        return pinned
    except OSError:
        return False


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def peak_mib(fn: Callable[[], object]) -> float:
    """Peak resident memory added by ``fn()``, in MiB (NaN where /proc is unavailable)."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        base = _status("VmRSS")
    except OSError:
        return float("nan")
    fn()
    return (_status("VmHWM") - base) / MiB
