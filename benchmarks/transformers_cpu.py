"""attnkit as a transformers ``attn_implementation`` on the CPU, side by side with its peers.

A Llama with 4 layers, width 256, 8 query heads and 2 key/value heads (GQA), random
weights, batch 2, in one process and one thread:

1. forward over T = 512 tokens: attnkit vs ``sdpa`` (goal: ratio <= 1.02);
2. forward + backward of the language-model loss: attnkit vs ``sdpa`` (<= 1.02);
3. greedy ``generate`` of 32 tokens from a 128-token prompt: attnkit vs ``sdpa`` (<= 1.02);
3b. greedy ``generate`` of 64 tokens for a left-padded batch of 4 prompts (40, 64, 90 and
   128 tokens): attnkit vs ``sdpa`` (<= 1.03), the padded decoding users run;
4. forward with ``output_attentions=True``: attnkit vs ``eager``, the only built-in that
   returns weights (<= 1.05);
5. (diagnostic) 3. with attnkit's ``attention()`` swapped for plain SDPA under the same
   glue: the integration's own cost, told apart from attnkit.torch's per-call cost.

Every model holds the same weights (one is built, the others are deep copies switched with
``set_attn_implementation``). Calls are interleaved, so background load hits all of them
alike, and each time is the median of several runs after one warm-up. Ratios are of CPU
time (one thread), which waiting for a core on a shared machine does not inflate; the wall
time ratio is printed next to it. Ratios are timed with glibc's default malloc, then again
with its mmap threshold pinned (the setting the peak readings need). Peak memory is the
rise of the process's resident-set high-water mark over its size before one call.

Usage::

    python benchmarks/transformers_cpu.py           # real sizes, appends to BENCHMARKS.md
    python benchmarks/transformers_cpu.py --quick   # small sizes, prints only
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import transformers  # noqa: E402
from _measure import paired_ratio, peak_mib, pin_malloc, rounds  # noqa: E402
from _report import report  # noqa: E402

import attnkit.integrations.transformers as integration  # noqa: E402
from attnkit.integrations.transformers import register  # noqa: E402

# CPU time (one torch thread) is what the ratios use: on a machine shared with other jobs,
# wall time also counts the time this process waited for a core, which swung single ratios
# by +-10% between runs; CPU time does not. Wall time is reported beside it.
CLOCKS = (time.process_time, time.perf_counter)


# -- measurement ---------------------------------------------------------------------------


# -- models --------------------------------------------------------------------------------


def build(impls: list[str], *, layers: int, width: int, heads: int, kv_heads: int,
          vocab: int) -> dict[str, torch.nn.Module]:
    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=width, intermediate_size=2 * width,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=4096, pad_token_id=0, bos_token_id=None, eos_token_id=None,
    )
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    models = {}
    for impl in impls:
        m = copy.deepcopy(base).eval()
        m.set_attn_implementation(register() if impl == "attnkit" else impl)
        models[impl] = m
    return models


def _plain_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: object = False,
                scale: float | None = None, **_: object) -> tuple[torch.Tensor, None]:
    """Stand-in for attnkit's ``attention()`` in the diagnostic row (unpadded causal
    decoding only: a bottom-right causal query block, nothing else)."""
    is_causal = causal is True and q.shape[-2] > 1 and q.shape[-2] == k.shape[-2]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=is_causal, scale=scale, enable_gqa=q.shape[-3] != k.shape[-3])
    return out, None


def _pinned_run(quick: bool, repeats: int) -> list[list[float]]:
    """``[pinned ratio, peer peak MiB, attnkit peak MiB]`` per case, from a fresh process
    that pins glibc's mmap threshold before it allocates anything (NaN on failure)."""
    cmd = [sys.executable, __file__, "--pinned", "--repeats", str(repeats)]
    proc = subprocess.run(cmd + (["--quick"] if quick else []), capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("PINNED "):
            return json.loads(line[len("PINNED "):])
    print(f"pinned run failed (exit {proc.returncode}): {proc.stderr[-500:]}")
    return [[math.nan] * 3 for _ in range(N_CASES)]


N_CASES = 6


def left_padded(vocab: int, lengths: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask)`` of prompts of ``lengths`` tokens, left-padded with 0."""
    g = torch.Generator().manual_seed(1)
    T = max(lengths)
    ids = torch.zeros(len(lengths), T, dtype=torch.long)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, T - n:] = torch.randint(1, vocab, (n,), generator=g)
        mask[row, T - n:] = 1
    return ids, mask


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, print only")
    ap.add_argument("--smoke", action="store_true",
                    help="as --quick, one round: checks that the script runs")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--pinned", action="store_true",
                    help="(internal) time with glibc's mmap threshold pinned and read peak "
                    "memory; print the figures as JSON")
    args = ap.parse_args()
    if args.smoke:
        args.quick, args.repeats = True, args.repeats or 1
    torch.set_num_threads(1)
    if args.pinned:
        pin_malloc()  # before anything is allocated: the readings start clean

    B, T, prompt, new = (2, 512, 128, 32) if not args.quick else (2, 64, 16, 4)
    repeats = args.repeats or (7 if not args.quick else 2)
    shape = dict(layers=4, width=256, heads=8, kv_heads=2, vocab=1024)
    models = build(["attnkit", "sdpa", "eager"], **shape)
    ids = torch.randint(1, shape["vocab"], (B, T), generator=torch.Generator().manual_seed(0))
    prompt_ids = ids[:, :prompt]
    lengths, padded_new = ((40, 64, 90, 128), 64) if not args.quick else ((5, 8, 12, 16), 4)
    padded_ids, padded_mask = left_padded(shape["vocab"], lengths)

    def forward(impl: str, **kw) -> Callable[[], object]:
        def run() -> None:
            with torch.no_grad():
                models[impl](ids, **kw)
        return run

    def train_step(impl: str) -> Callable[[], object]:
        def run() -> None:
            models[impl].zero_grad(set_to_none=True)
            models[impl](ids, labels=ids).loss.backward()
        return run

    def generate(impl: str) -> Callable[[], object]:
        def run() -> None:
            with torch.no_grad():
                models[impl].generate(prompt_ids, max_new_tokens=new, min_new_tokens=new,
                                      do_sample=False, pad_token_id=0)
        return run

    def generate_left_padded(impl: str) -> Callable[[], object]:
        def run() -> None:
            with torch.no_grad():
                models[impl].generate(padded_ids, attention_mask=padded_mask,
                                      max_new_tokens=padded_new, min_new_tokens=padded_new,
                                      do_sample=False, pad_token_id=0)
        return run

    def glue_only(make: Callable[[str], Callable[[], object]]) -> Callable[[str], object]:
        """``make`` with attnkit's ``attention()`` swapped for plain SDPA under the same
        glue: what the integration itself costs, apart from attnkit.torch."""
        def make_swapped(impl: str) -> Callable[[], object]:
            run = make(impl)
            if impl != "attnkit":
                return run

            def swapped() -> None:
                integration.attention = _plain_sdpa
                try:
                    run()
                finally:
                    integration.attention = attention
            return swapped
        return make_swapped

    attention = integration.attention
    cases = [
        (f"forward, T={T}", "sdpa", forward),
        (f"forward+backward, T={T}", "sdpa", train_step),
        (f"generate {new} tokens from {prompt}", "sdpa", generate),
        (f"generate {padded_new} tokens, B={len(lengths)} left-padded prompts "
         f"{'/'.join(map(str, lengths))}", "sdpa", generate_left_padded),
        (f"forward output_attentions=True, T={T}", "eager",
         lambda impl: forward(impl, output_attentions=True)),
        (f"(diagnostic) generate {new} from {prompt}, glue only", "sdpa", glue_only(generate)),
    ]
    assert len(cases) == N_CASES
    fns_of = [{peer: make(peer), "attnkit": make("attnkit")} for _, peer, make in cases]
    if args.pinned:
        pinned = []
        for (_, peer, _), fns in zip(cases, fns_of):
            t_pin, _ = rounds(fns, repeats, CLOCKS)
            mem = {impl: peak_mib(fn) for impl, fn in fns.items()}
            pinned.append([paired_ratio(t_pin, "attnkit", peer), mem[peer], mem["attnkit"]])
        print("PINNED " + json.dumps(pinned))
        return
    # Timing with glibc's own malloc (what a user runs); then, in a fresh process, again
    # with its mmap threshold pinned, which the peak-memory readings need (freed tensors go
    # back to the OS) but which makes every allocation over 128 KiB a fresh mmap with page
    # faults: it slows the peer itself by about half and bills each extra allocation.
    timed = [rounds(fns, repeats, CLOCKS) for fns in fns_of]
    pinned = _pinned_run(args.quick, repeats)
    rows = []
    med = statistics.median
    for (name, peer, _), (t, wall), (r_pin, mem_peer, mem_ours) in zip(cases, timed, pinned):
        rows.append([name, peer, ms(med(t[peer])), ms(med(t["attnkit"])),
                     f"{paired_ratio(t, 'attnkit', peer):.3f}",
                     f"{paired_ratio(wall, 'attnkit', peer):.3f}",
                     f"{r_pin:.3f}", f"{mem_peer:.1f}", f"{mem_ours:.1f}"])
        print(rows[-1], flush=True)

    report(
        "attnkit as a transformers attn_implementation vs sdpa / eager (CPU, Llama)",
        ["case", "peer", "peer CPU ms", "attnkit CPU ms", "ratio", "wall ratio",
         "ratio, mmap pinned", "peer peak MiB", "attnkit peak MiB"],
        rows,
        notes=(
            f"transformers {transformers.__version__}. LlamaConfig: {shape['layers']} layers, "
            f"width {shape['width']}, {shape['heads']} heads / {shape['kv_heads']} KV heads, "
            f"MLP {2 * shape['width']}, vocab {shape['vocab']}, random weights; B={B}, float32, "
            f"no padding; one model built, the others deep copies switched with "
            f"set_attn_implementation. Median of {repeats} interleaved runs after one "
            "warm-up (order alternating); torch.set_num_threads(1); ratio = median over "
            "rounds of the CPU-time ratio (process_time) within the round, wall ratio the "
            "same of wall times (earlier entries: ratio of the medians); times are medians; "
            "both with glibc's default malloc. "
            "'ratio, mmap pinned' = the CPU-time ratio timed again with glibc's mmap "
            "threshold pinned at 128 KiB in a fresh process (as the peak readings need; "
            "earlier entries were timed only that way): every allocation over 128 KiB is a "
            "fresh mmap, which slows the peer too and bills each extra allocation as page "
            "faults. forward+backward: loss of labels = inputs. "
            "generate: greedy, dynamic cache; the left-padded row pads each prompt on the "
            "left to the longest with a 2-D attention_mask; the plain row's prompt has no "
            "padding, so the diagnostic's "
            "stand-in (causal SDPA) computes the same thing. "
            "Peak = rise of VmHWM over RSS during one call. "
            "The machine was shared with other jobs during the run."
        ),
        record=not args.quick,
    )


if __name__ == "__main__":
    main()
