"""One rank of the multi-process ring-attention tests (run by conftest.launch, not by pytest).

Usage: ring_worker.py RANK WORLD_SIZE INIT_METHOD CASES_JSON OUT_DIR [--fail-rank R]

Every rank builds the same full inputs from a seed, takes its shard, runs ring attention
forward and backward, and gathers the results; rank 0 compares them with the float64
reference (``attnkit.testing.reference_attention``) and, for lower-precision cases, with
plain single-process math in that dtype (the baseline of the 2x/3x/5x rule), and writes
``result.json``. Errors are judged by the test.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from attnkit.distributed import gather_sequence, ring_attention, shard_sequence
from attnkit.testing import large_logit_inputs, max_mean_error, reference_attention
from conftest import reference  # the script's folder is on sys.path

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def ref_grads(q, k, v, dout, sinks=None, **kw):
    """``(out, dq, dk, dv[, dsinks])``: the float64 reference's for float64 inputs, else
    those of plain math in the inputs' dtype (the baseline)."""
    if q.dtype == torch.float64:
        r = reference_attention(q, k, v, d_out=dout, sinks=sinks, **kw)
        grads = (r.out, r.dq, r.dk, r.dv) + (() if sinks is None else (r.dsinks,))
        return tuple(torch.from_numpy(x) for x in grads)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    if sinks is not None:
        leaves.append(sinks.detach().clone().requires_grad_(True))
    out = reference(*leaves[:3], sinks=None if sinks is None else leaves[3], **kw)
    return (out.detach(), *torch.autograd.grad(out, leaves, dout))


def packed_ids(B: int, T: int, gen: torch.Generator) -> torch.Tensor:
    """Packed documents of random lengths, with right padding (id -1) in row 0."""
    ids = torch.zeros(B, T, dtype=torch.int64)
    for b in range(B):
        for cut in torch.randint(1, T, (4,), generator=gen).tolist():
            ids[b, cut:] += 1
    ids[0, T - T // 5 :] = -1
    return ids


def run_case(case: dict, group: dist.ProcessGroup | None = None) -> dict | None:
    """Run one case on ``group``; the results on its rank 0, None on the other ranks."""
    gen = torch.Generator().manual_seed(case["seed"])
    P, rank = dist.get_world_size(group), dist.get_rank(group)
    n_chunks = 2 * P if case["layout"] == "zigzag" else P
    B, H, Hkv, Dk, Dv = case["B"], case["H"], case["Hkv"], case["Dk"], case["Dv"]
    T = n_chunks * case["chunk"]
    full = {
        "q": torch.randn(B, H, T, Dk, generator=gen, dtype=torch.float64),
        "k": torch.randn(B, Hkv, T, Dk, generator=gen, dtype=torch.float64),
        "v": torch.randn(B, Hkv, T, Dv, generator=gen, dtype=torch.float64),
        "dout": torch.randn(B, H, T, Dv, generator=gen, dtype=torch.float64),
    }
    if "logit" in case:  # logits logit + O(1), exact in float32 (Dk = 64)
        arrays = large_logit_inputs(B, H, Hkv, T, T, Dv, logit=case["logit"], seed=case["seed"])
        full = dict(zip(("q", "k", "v", "dout"), (torch.from_numpy(x) for x in arrays)))
    valid = case.get("valid_lens")
    valid_lens = None if valid is None else torch.tensor([min(x, T) for x in valid])
    dtype, layout, causal = DTYPES[case["dtype"]], case["layout"], case["causal"]
    ids = packed_ids(B, T, gen) if case.get("segments") else None
    sinks = torch.randn(H, generator=gen, dtype=torch.float64) if case.get("sinks") else None
    variants = dict(softcap=case.get("softcap"), segment_ids=ids)

    shards = {n: shard_sequence(t.to(dtype), layout=layout, group=group) for n, t in full.items()}
    q, k, v = (shards[n].clone().requires_grad_(True) for n in ("q", "k", "v"))
    z = None if sinks is None else sinks.to(dtype).requires_grad_(True)
    ids_shard = None if ids is None else shard_sequence(ids, dim=1, layout=layout, group=group)
    out = ring_attention(
        q, k, v, causal=causal, layout=layout, valid_lens=valid_lens, group=group,
        softcap=case.get("softcap"), sinks=z, segment_ids=ids_shard,
    )
    # Through gather_sequence, so its backward is exercised too: every rank's loss covers
    # the full output, so each shard's gradient is P times the true one.
    loss = (gather_sequence(out, layout=layout, group=group) * full["dout"].to(dtype)).sum()
    loss.backward()
    got = {
        "out": gather_sequence(out.detach(), layout=layout, group=group),
        "dq": gather_sequence(q.grad / P, layout=layout, group=group),
        "dk": gather_sequence(k.grad / P, layout=layout, group=group),
        "dv": gather_sequence(v.grad / P, layout=layout, group=group),
    }
    names = ("out", "dq", "dk", "dv")
    if z is not None:  # each rank holds its rows' share, of P times the true gradient
        dsinks = z.grad.clone()
        dist.all_reduce(dsinks, group=group)
        got["dsinks"] = dsinks / P
        names += ("dsinks",)
    if rank != 0:
        return None
    kw = dict(causal=causal, valid_lens=valid_lens, **variants)
    ref = dict(zip(names, ref_grads(*full.values(), sinks=sinks, **kw)))
    low = {n: t.to(dtype) for n, t in full.items()}
    base = dict(zip(names, ref_grads(*low.values(), sinks=None if sinks is None
                                     else sinks.to(dtype), **kw)))
    res = {}
    for name in got:
        fin = ~torch.isnan(ref[name])  # NaN cases: compare values where the reference has some
        res[name] = {
            "err": max_mean_error(got[name][fin], ref[name][fin]),
            "base": max_mean_error(base[name][fin], ref[name][fin]),
            "nan": bool(torch.isnan(got[name][fin]).any()),
            "nan_match": bool(torch.equal(torch.isnan(got[name]), ~fin)),
            "shape_ok": tuple(got[name].shape) == tuple(ref[name].shape),
        }
    if valid_lens is not None:
        dead = valid_lens == 0  # batch rows with no allowed key at all
        res["dead_rows_zero"] = all(
            bool((got[n][dead] == 0).all()) for n in ("out", "dq", "dk", "dv")
        )
    if ids is not None:  # padding attends and is attended by nothing
        pad = ids < 0
        res["padding_zero"] = all(
            bool((got[n].transpose(1, 2)[pad] == 0).all()) for n in ("out", "dq", "dk", "dv")
        )
    return res


def check_sharding(rank: int) -> dict:
    """shard/gather round trips on any axis; a length not divisible by the chunk count raises
    ValueError on every rank before any communication."""
    P = dist.get_world_size()
    ok = {}
    x = torch.arange(2 * 4 * P * 3, dtype=torch.float64).reshape(2, 4 * P, 3)  # (B, T, E)
    for layout in ("zigzag", "contiguous"):
        shard = shard_sequence(x, dim=1, layout=layout)
        ok[f"roundtrip_{layout}"] = bool(
            shard.shape[1] == 4 and torch.equal(gather_sequence(shard, dim=1, layout=layout), x)
        )
    # Chunk length 2: rank r holds chunk r and chunk 2P-1-r.
    zz, lo, hi = shard_sequence(x, dim=1), 2 * rank, 2 * (2 * P - 1 - rank)
    ok["zigzag_chunks"] = torch.equal(zz, torch.cat([x[:, lo : lo + 2], x[:, hi : hi + 2]], 1))
    x = torch.zeros(1, 1, 2 * P + 1, 4)
    for layout in ("zigzag", "contiguous"):
        try:
            shard_sequence(x, layout=layout)
            ok[f"shard_{layout}"] = False
        except ValueError as e:
            ok[f"shard_{layout}"] = "divisible" in str(e)
    odd = torch.zeros(1, 1, 3, 4)
    try:
        ring_attention(odd, odd, odd)
        ok["ring_zigzag_odd"] = False
    except ValueError as e:
        ok["ring_zigzag_odd"] = "multiple of" in str(e)
    return ok


def check_agreement(rank: int) -> dict:
    """Shards that disagree between ranks raise one ValueError on every rank, naming every
    rank's shapes, before any transfer; the group stays usable. Returns this rank's
    messages (or what happened instead)."""

    def attempt(q, k, v, **kw):
        try:
            ring_attention(q, k, v, **kw)
        except ValueError as e:
            return str(e)
        return "no error"

    z = torch.zeros
    msgs = {
        # The same byte count: before, the ring ran to completion on misread data.
        "same_bytes": attempt(*(z(1, 2, 8, 8) if rank == 0 else z(1, 2, 4, 16),) * 3),
        # Different sizes: before, gloo aborted rank 0 (SIGABRT) instead of raising.
        "sizes": attempt(*(z(1, 2, 4 * (1 + (rank == 1)), 8),) * 3),
        "dtypes": attempt(*(z(1, 2, 4, 8, dtype=torch.float64 if rank else torch.float32),) * 3),
        "heads": attempt(z(1, 4, 4, 8), *(z(1, 2 if rank else 4, 4, 8),) * 2),
        "causal": attempt(*(z(1, 2, 4, 8),) * 3, causal=rank == 0),
        "valid_lens": attempt(*(z(1, 2, 4, 8),) * 3, valid_lens=torch.tensor([1 + rank])),
    }
    # A rank that fails its own check (T = 3 is not a multiple of the chunk count) fails
    # after the exchange, so every rank raises it: nobody waits on a transfer.
    msgs["local"] = attempt(*(z(1, 2, 3, 8),) * 3)
    # Still usable afterwards.
    ok = ring_attention(*(torch.ones(1, 2, 4, 8),) * 3)
    msgs["usable"] = bool(torch.allclose(ok, torch.ones_like(ok)))
    return msgs


def main() -> None:
    rank, world, init, cases_path, out_dir = sys.argv[1:6]
    rank, world = int(rank), int(world)
    fail_rank = int(sys.argv[7]) if len(sys.argv) > 7 and sys.argv[6] == "--fail-rank" else -1
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    if rank == fail_rank:
        raise RuntimeError(f"rank {rank} fails on purpose")
    cases = json.loads(Path(cases_path).read_text())
    results = {"errors": check_sharding(rank)}
    agreement = [None] * world
    dist.all_gather_object(agreement, check_agreement(rank))
    results["agreement"] = agreement
    for case in cases:
        results[case["id"]] = run_case(case)
    if world == 4:
        # A 3-rank ring on global ranks 1..3: peers must be mapped to global ranks, and
        # rank 0, outside the group, takes no part (and is not waited for).
        sub = dist.new_group([1, 2, 3])
        if rank != 0:
            sub_results = {c["id"]: run_case(c, sub) for c in cases if c.get("subgroup")}
            if rank == 1:
                Path(out_dir, "subgroup.json").write_text(json.dumps(sub_results))
    if rank == 0:
        Path(out_dir, "result.json").write_text(json.dumps(results))
    dist.barrier()
    if rank == 0 and world == 4:
        results["subgroup"] = json.loads(Path(out_dir, "subgroup.json").read_text())
        Path(out_dir, "result.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
