"""attnkit.torch on CPU, side by side with its peers in one run.

0. attnkit vs the PyTorch call it wraps (benchmarks/_torch_overhead.py): prefill and
   decoding vs SDPA, need_weights vs eager softmax(q k^T) v, a MultiHeadAttention decoding
   step through a KV cache vs the same step on SDPA; and need_weights' peak memory.
1. ``MultiHeadAttention`` forward+backward vs ``torch.nn.MultiheadAttention`` (same weights,
   same inputs), at (B=8, T=512, E=512, H=8) and (B=1, T=4096, E=512, H=8). Goal: ratio
   <= 1.05.
2. The same with ``need_weights=True`` (both return averaged weights): time and peak memory.
3. KV-cache decoding of 1024 tokens vs recomputing the full causal forward at every step.
4. Chunked additive attention vs the materialised ``(B, Tq, Tk, h)`` formulation at
   Tq = Tk = 2048, h = 256: time and peak memory.

Peak memory is the rise of the process's resident-set high-water mark (``VmHWM``, reset
through ``/proc/self/clear_refs``) over its resident size before the call. glibc's mmap
threshold is pinned at 128 KiB so that freed tensors go back to the OS and each
measurement starts from the live set.

Usage::

    python benchmarks/torch_cpu.py           # real sizes, appends to BENCHMARKS.md
    python benchmarks/torch_cpu.py --quick   # small sizes, prints only
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import _torch_overhead  # noqa: E402
from _measure import MiB, paired_ratio, pin_malloc, rounds  # noqa: E402
from _measure import peak_mib as peak_memory  # noqa: E402
from _report import report  # noqa: E402
from _torch_overhead import eager_weights, functional_rows, mha_decode_rows  # noqa: E402

import attnkit.torch as at  # noqa: E402


def context() -> str:
    return (f"torch intra-op threads: {torch.get_num_threads()}. The machine was shared with "
            "other jobs during the run.")


def ms(seconds: float) -> str:
    """Milliseconds, printed plainly (the report's generic float format would use e+03)."""
    return f"{seconds * 1e3:.1f}"


def mib(n: float) -> str:
    return f"{n:.1f}"


# -- measurement ---------------------------------------------------------------------------


def side_by_side(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each function, calls interleaved (:func:`_measure.rounds`)."""
    return {name: statistics.median(ts) for name, ts in rounds(fns, repeats)[0].items()}


# -- 0: attnkit vs the plain PyTorch call it wraps (issue 11) -----------------------------


def bench_overhead(quick: bool, record: bool) -> None:
    rows = functional_rows(quick) + mha_decode_rows(quick)
    report(
        "attnkit.torch vs the PyTorch call it wraps: prefill, decoding, need_weights (CPU)",
        ["case", "peer", "peer ms", "attnkit ms", "ratio"],
        rows,
        notes=(
            "Forward only, torch.no_grad(), float32, D=64. Ratio = median over interleaved "
            "rounds of (attnkit / peer) per round (order alternating); times are medians "
            "per call. Peers: SDPA with the same mask (a bool key mask for padding; no mask "
            "for one query under causal; is_causal for a causal prefill); eager = "
            "softmax((q * scale) @ k^T [+ padding bias]) @ v returning the weights; an SDPA "
            "decoding step = the same four projections, a write into preallocated buffers, "
            "SDPA over the filled part. attnkit builds the mask from valid_lens itself (an "
            "arange and a compare per call) and checks them on the CPU. " + context()
        ),
        record=record,
    )


def bench_weights_memory(T: int, record: bool) -> None:
    B, H, D = 2, 8, 64
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    with torch.no_grad():
        eager = peak_memory(lambda: eager_weights(q, k, v))
        ours = peak_memory(lambda: at.attention(q, k, v, need_weights=True))
    scores = B * H * T * T * 4 / MiB
    report(
        f"attnkit.torch need_weights=True vs eager softmax(q k^T) v: peak memory (CPU, T={T})",
        ["case", "eager peak MiB", "attnkit peak MiB", "ratio", "one (B,H,T,T) f32 MiB"],
        [[f"B={B} H={H} T={T} D={D}, forward", mib(eager), mib(ours),
          round(ours / eager, 3), mib(scores)]],
        notes=("torch.no_grad(). Peak = rise of VmHWM over RSS before the call, glibc's mmap "
               "threshold pinned at 128 KiB. Eager holds the scores and their softmax at "
               "once; attnkit's softmax overwrites the scores in place on the CPU, so the "
               "weights it returns are its one (B, H, T, T) buffer. " + context()),
        record=record,
    )


# -- 1 and 2: MultiHeadAttention vs nn.MultiheadAttention -----------------------------------


def mha_pair(E: int, H: int) -> tuple[nn.MultiheadAttention, at.MultiHeadAttention]:
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(E, H, batch_first=True)
    return ref, at.MultiHeadAttention.from_torch(ref)


def _mha_runs(B: int, T: int, E: int, H: int, need_weights: bool) -> dict:
    ref, ours = mha_pair(E, H)
    x = torch.randn(B, T, E, requires_grad=True)

    def run_ref() -> None:
        out, _ = ref(x, x, x, need_weights=need_weights)
        out.sum().backward()

    def run_ours() -> None:
        out, _ = ours(x, need_weights=need_weights)
        out.sum().backward()

    return {"ref": run_ref, "ours": run_ours}


def mha_times(configs: list[tuple[int, int]], E: int, H: int, repeats: int,
              need_weights: bool) -> list[dict[str, list[float]]]:
    """Per-round seconds of each config (timed before glibc's mmap threshold is pinned)."""
    return [rounds(_mha_runs(B, T, E, H, need_weights), repeats)[0] for B, T in configs]


def _mha_row(B: int, T: int, E: int, H: int, need_weights: bool,
             t: dict[str, list[float]]) -> list:
    runs = _mha_runs(B, T, E, H, need_weights)
    mem_ref, mem_ours = peak_memory(runs["ref"]), peak_memory(runs["ours"])
    med = statistics.median
    flops = 3.5 * 4 * B * H * T * T * (E // H)  # attention only: fwd + 2.5x bwd
    return [
        f"B={B} T={T} E={E} H={H}", ms(med(t["ref"])), ms(med(t["ours"])),
        round(paired_ratio(t, "ours", "ref"), 3), mib(mem_ref),
        mib(mem_ours), round(flops / med(t["ours"]) / 1e9, 1),
    ]


def bench_mha(configs: list[tuple[int, int]], E: int, H: int, repeats: int,
              need_weights: bool, record: bool,
              times: list[dict[str, list[float]]]) -> None:
    rows = [_mha_row(B, T, E, H, need_weights, t) for (B, T), t in zip(configs, times)]
    kind = "need_weights=True" if need_weights else "need_weights=False"
    report(
        f"attnkit.torch MultiHeadAttention vs nn.MultiheadAttention, forward+backward, "
        f"{kind} (CPU)",
        ["config", "nn.MHA ms", "attnkit ms", "ratio", "nn.MHA peak MiB",
         "attnkit peak MiB", "attnkit attn GFLOP/s"],
        rows,
        notes=(
            f"{repeats} interleaved rounds after one warm-up (order alternating), timed "
            "with glibc's default malloc before its mmap threshold is pinned for the peak "
            "readings; ratio = median over rounds of attnkit / nn.MHA within the round "
            "(earlier entries: ratio of medians, timed with the threshold pinned); times are "
            "medians. Same weights and inputs; loss = out.sum(). "
            "Peak = rise of VmHWM over RSS before the call. "
            + ("Both return head-averaged weights; attnkit keeps the output on the fused "
               "kernel and derives the weights from its log-sum-exp, nn.MultiheadAttention "
               "falls back to its unfused math path. " if need_weights else "")
            + "Single timings are noisy; ratios come from interleaved runs. " + context()
        ),
        record=record,
    )


# -- 3: KV-cache decoding -------------------------------------------------------------------


def bench_decode(N: int, E: int, H: int, samples: int, record: bool) -> None:
    torch.manual_seed(0)
    m = at.MultiHeadAttention(E, H).eval()
    x = torch.randn(1, N, E)
    cache = m.init_cache(1, N)

    def decode_all() -> None:
        cache.reset()
        for t in range(N):
            m(x[:, t:t + 1], causal=True, cache=cache)

    with torch.no_grad():
        total_cache = side_by_side({"cache": decode_all}, 3)["cache"]
        mem_cache = peak_memory(decode_all)

        # Recomputing the full causal forward for every new token costs sum_t f(t); timing
        # all N steps would take minutes, so f is timed at `samples` lengths and summed
        # with the trapezoid rule over t = 1..N (f is smooth and increasing in t).
        lengths = sorted({max(1, round(N * (i + 1) / samples)) for i in range(samples)})
        lengths = [1] + [t for t in lengths if t > 1]
        rows = []
        per_step_recompute = {}
        for t in lengths:
            def step_cache(t: int = t) -> None:
                cache.length = t - 1  # positions [0, t-1) still hold the decoded prefix
                m(x[:, t - 1:t], causal=True, cache=cache)

            def step_full(t: int = t) -> None:
                m(x[:, :t], causal=True)

            tm = side_by_side({"cache": step_cache, "full": step_full}, 3)
            per_step_recompute[t] = tm["full"]
            if t in (1, lengths[len(lengths) // 2], lengths[-1]) or len(lengths) <= 4:
                rows.append([f"one step at t={t}", ms(tm["full"]), ms(tm["cache"]),
                             round(tm["full"] / tm["cache"], 2), "", ""])
        ts = sorted(per_step_recompute)
        total_full = 0.0
        for a, b in zip(ts, ts[1:]):
            total_full += (per_step_recompute[a] + per_step_recompute[b]) / 2 * (b - a)
        total_full += per_step_recompute[ts[0]]
        mem_full = peak_memory(lambda: m(x, causal=True))
    rows.append([f"decode {N} tokens (total)", ms(total_full), ms(total_cache),
                 round(total_full / total_cache, 1), mib(mem_full), mib(mem_cache)])
    report(
        f"attnkit.torch KV-cache decoding vs full recompute per step (CPU, E={E}, H={H}, B=1)",
        ["case", "recompute ms", "KV cache ms", "speed-up", "recompute peak MiB",
         "cache peak MiB"],
        rows,
        notes=(
            "torch.no_grad(). KV cache: all tokens decoded one at a time (median of 3 runs). "
            "Recompute: "
            f"the full causal forward over the prefix timed at {len(ts)} prefix lengths "
            "(median of 3) and summed over t = 1..N by the trapezoid rule; its peak is one "
            f"forward at t = {N}. The cache itself holds 2 x N x E floats, preallocated before "
            "measuring. " + context()
        ),
        record=record,
    )


# -- 4: chunked vs materialised additive attention ---------------------------------------


def materialised_additive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          attn: at.AdditiveAttention) -> torch.Tensor:
    """The textbook formulation: all (B, Tq, Tk, h) tanh features at once (tanh in place,
    so it holds one such tensor, not two)."""
    feats = (attn.W_q(q)[:, :, None, :] + attn.W_k(k)[:, None, :, :]).tanh_()
    scores = attn.w_v(feats).squeeze(-1)  # (B, Tq, Tk)
    return torch.softmax(scores, dim=-1) @ v


def _additive_row(attn: at.AdditiveAttention, T: int, train: bool, D: int, h: int,
                  repeats: int) -> list:
    q = torch.randn(1, T, D, requires_grad=train)
    k, v = torch.randn(1, T, D), torch.randn(1, T, D)

    def chunked() -> None:
        out = attn(q, k, v)
        if train:
            out.sum().backward()

    def full() -> None:
        out = materialised_additive(q, k, v, attn)
        if train:
            out.sum().backward()

    with torch.set_grad_enabled(train):
        t = side_by_side({"full": full, "chunked": chunked}, repeats)
        mem_full, mem_chunked = peak_memory(full), peak_memory(chunked)
    with torch.no_grad():
        err = (attn(q, k, v) - materialised_additive(q, k, v, attn)).abs().max().item()
    feats = T * T * h * 4 / MiB
    return [
        f"{'fwd+bwd' if train else 'forward'} Tq=Tk={T} h={h}", ms(t["full"]),
        ms(t["chunked"]), round(t["chunked"] / t["full"], 3), mib(mem_full), mib(mem_chunked),
        mib(feats), f"{err:.1e}",
    ]


def bench_additive(T_fwd: int, T_bwd: int, h: int, D: int, repeats: int, record: bool) -> None:
    torch.manual_seed(0)
    attn = at.AdditiveAttention(D, D, h)
    rows = [_additive_row(attn, T, train, D, h, repeats)
            for T, train in ((T_fwd, False), (T_bwd, True))]
    budget = attn.max_chunk_elements * 4 / MiB
    report(
        "attnkit.torch AdditiveAttention: key-chunked vs materialised (B, Tq, Tk, h) (CPU)",
        ["case", "materialised ms", "chunked ms", "ratio", "materialised peak MiB",
         "chunked peak MiB", "features MiB", "max abs diff"],
        rows,
        notes=(
            f"float32, B=1, query/key width {D}. Chunk budget {budget:.0f} MiB of features "
            "(max_chunk_elements); the chunked backward recomputes each chunk instead of "
            f"storing it. fwd+bwd runs at T={T_bwd}: the materialised version at T={T_fwd} "
            f"would hold several {T_fwd * T_fwd * h * 4 / MiB:.0f} MiB tensors at once on a "
            "shared machine. Median of "
            f"{repeats} interleaved runs. " + context()
        ),
        record=record,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, print only (no BENCHMARKS.md entry)")
    parser.add_argument("--smoke", action="store_true", help="as --quick")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's own choice); on a "
                        "machine shared with other jobs, 1 avoids timing the OS scheduler")
    parser.add_argument("--cpu-clock", action="store_true",
                        help="time section 0's ratios with the thread's CPU time instead of "
                        "wall time (use with --threads 1 on a machine shared with other jobs)")
    parser.add_argument("--only-overhead", action="store_true",
                        help="only section 0 (attnkit vs the PyTorch call it wraps)")
    args = parser.parse_args(argv)
    args.quick = args.quick or args.smoke
    if args.cpu_clock:
        _torch_overhead.CLOCK = time.thread_time
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    record = not args.quick
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    # Timing first, with glibc's own malloc (pinning its mmap threshold for the memory
    # readings makes every large allocation a fresh mmap, which would bill the side that
    # allocates more for page faults rather than work); the MultiHeadAttention rows are
    # timed here too and read their peaks after the pin.
    bench_overhead(args.quick, record)
    if args.only_overhead:
        return
    if args.quick:
        mha = [([(2, 128), (1, 512)], 128, 4, 3, False), ([(2, 128)], 128, 4, 3, True)]
    else:
        mha = [([(8, 512), (1, 4096)], 512, 8, 7, False), ([(8, 512), (1, 2048)], 512, 8, 5, True)]
    mha_timed = [mha_times(configs, E, H, n, nw) for configs, E, H, n, nw in mha]
    if not pin_malloc():
        print("warning: could not pin glibc's mmap threshold; peak memory may read low")
    bench_weights_memory(512 if args.quick else 2048, record)
    for (configs, E, H, n, nw), times in zip(mha, mha_timed):
        bench_mha(configs, E, H, repeats=n, need_weights=nw, record=record, times=times)
    if args.quick:
        bench_decode(64, 128, 4, samples=4, record=record)
        bench_additive(256, 128, 32, 32, repeats=2, record=record)
    else:
        bench_decode(1024, 512, 8, samples=16, record=record)
        bench_additive(2048, 1024, 256, 64, repeats=3, record=record)
    if math.isnan(peak_memory(lambda: None)):
        print("note: /proc/self/clear_refs unavailable, peak memory not measured")


if __name__ == "__main__":
    main()
