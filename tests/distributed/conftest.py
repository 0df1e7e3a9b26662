"""Launching gloo process groups for the ring-attention tests, with no way to hang.

Each rank is a fresh ``python ring_worker.py`` subprocess (no pickling of test functions,
which ``--import-mode=importlib`` would break), rendezvous through a ``file://`` init method
in a temporary directory (no port to race for). The launcher polls the ranks: the first
rank that exits non-zero fails the launch at once and the others are killed; a launch that
outlives its deadline is killed too. Workers also set a 60 s gloo timeout.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit.testing import reference_attention

WORKER = Path(__file__).with_name("ring_worker.py")
SRC = Path(attnkit.__file__).resolve().parent.parent


class _Float64Reference(torch.autograd.Function):
    """``attnkit.testing.reference_attention`` (the float64 reference of every backend's
    tests) as a differentiable op: its output forward, its gradients backward."""

    @staticmethod
    def forward(ctx, q, k, v, options):  # type: ignore[override]
        ctx.save_for_backward(q, k, v)
        ctx.options = options
        return torch.from_numpy(reference_attention(q, k, v, **options).out)

    @staticmethod
    def backward(ctx, d_out):  # type: ignore[override]
        r = reference_attention(*ctx.saved_tensors, d_out=d_out, **ctx.options)
        return torch.from_numpy(r.dq), torch.from_numpy(r.dk), torch.from_numpy(r.dv), None


def reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    valid_lens: torch.Tensor | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Single-process attention, differentiable; a row with no allowed key gives 0.

    float64 inputs get the float64 reference (``attnkit.testing.reference_attention``);
    any other dtype gets plain math in that dtype, the baseline of the 2x/3x/5x rule
    (differentiable in ``sinks`` too).
    q ``(B, H, Tq, Dk)``, k ``(B, Hkv, Tk, Dk)``, v ``(B, Hkv, Tk, Dv)``; causal is
    bottom-right aligned; ``valid_lens`` ``(B,)`` keeps keys ``j < valid_lens[b]``;
    ``segment_ids`` ``(B, T)`` (``Tq == Tk``) keeps equal ids ``>= 0``.
    """
    if q.dtype == torch.float64 and sinks is None:
        options = dict(causal=causal, valid_lens=valid_lens, scale=scale, softcap=softcap,
                       segment_ids=segment_ids)
        return _Float64Reference.apply(q, k, v, options)
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    T, S = s.shape[-2:]
    keep = torch.ones(T, S, dtype=torch.bool)
    if causal:
        keep = keep.tril(S - T)
    keep = keep.expand(q.shape[0], 1, T, S)
    if valid_lens is not None:
        keep = keep & (torch.arange(S)[None, :] < valid_lens[:, None])[:, None, None, :]
    if segment_ids is not None:
        ids = segment_ids[:, :, None]
        keep = keep & ((ids == segment_ids[:, None, :]) & (ids >= 0))[:, None]
    s = torch.where(keep, s, -math.inf)
    m = s.amax(-1, keepdim=True)
    if sinks is not None:
        m = torch.maximum(m, sinks.to(s.dtype)[None, :, None, None])
    p = torch.exp(s - torch.where(torch.isneginf(m), 0.0, m))
    l = p.sum(-1, keepdim=True)
    if sinks is not None:
        l = l + torch.exp(sinks.to(s.dtype)[None, :, None, None] - torch.where(
            torch.isneginf(m), 0.0, m))
    return (p / torch.where(l == 0, 1.0, l)) @ v


@pytest.fixture
def attention_ref():
    """The reference attention above (float64 reference, or same-dtype baseline)."""
    return reference


class RankFailure(AssertionError):
    """A rank exited non-zero or the launch ran past its deadline."""


def _failed(procs: list[subprocess.Popen]) -> str:
    codes = {r: p.returncode for r, p in enumerate(procs) if p.returncode not in (None, 0)}
    return f"ranks exited non-zero (rank: code): {codes}"


def launch(
    world_size: int, workdir: Path, cases: list[dict], *, timeout: float = 60.0,
    fail_rank: int | None = None,
) -> dict:
    """Run ``world_size`` worker ranks over ``cases``; return rank 0's ``result.json``."""
    workdir.mkdir(parents=True, exist_ok=True)
    cases_path = workdir / "cases.json"
    cases_path.write_text(json.dumps(cases))
    init = f"file://{workdir / 'rendezvous'}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    extra = [] if fail_rank is None else ["--fail-rank", str(fail_rank)]
    procs = []
    logs = []
    for rank in range(world_size):
        log = open(workdir / f"rank{rank}.log", "w+")  # noqa: SIM115 - closed below
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), str(rank), str(world_size), init,
                 str(cases_path), str(workdir), *extra],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )
        )
    deadline = time.monotonic() + timeout
    failure = None
    try:
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs):
                failure = _failed(procs)
                break
            if time.monotonic() > deadline:
                failure = f"ranks still running after {timeout:.0f} s"
                break
            time.sleep(0.05)
        else:
            if any(p.returncode != 0 for p in procs):
                failure = _failed(procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait(timeout=10)
    if failure is not None:
        tails = []
        for rank, log in enumerate(logs):
            log.seek(0)
            tails.append(f"--- rank {rank} ---\n" + log.read()[-3000:])
        for log in logs:
            log.close()
        raise RankFailure(failure + "\n" + "\n".join(tails))
    for log in logs:
        log.close()
    return json.loads((workdir / "result.json").read_text())


def _cases() -> list[dict]:
    cases = []
    heads = [(4, 4, 7, 7), (4, 2, 7, 5), (3, 1, 5, 6)]  # (H, Hkv, Dk, Dv): MHA, GQA, MQA
    for (causal, layout, (H, Hkv, Dk, Dv)) in itertools.product(
        (False, True), ("zigzag", "contiguous"), heads
    ):
        cases.append(dict(dtype="float64", causal=causal, layout=layout, B=2, H=H, Hkv=Hkv,
                          Dk=Dk, Dv=Dv, chunk=3))
    # valid_lens: batch row 0 has no key at all (every query row fully masked); row 1 keeps
    # only the first 4 keys, so later K/V blocks bring no allowed key to any query.
    for causal, layout in ((False, "zigzag"), (True, "zigzag"), (True, "contiguous")):
        cases.append(dict(dtype="float64", causal=causal, layout=layout, B=2, H=4, Hkv=2,
                          Dk=7, Dv=5, chunk=3, valid_lens=[0, 4]))
    for causal in (False, True):
        cases.append(dict(dtype="float32", causal=causal, layout="zigzag", B=2, H=4, Hkv=2,
                          Dk=16, Dv=16, chunk=8))
        cases.append(dict(dtype="float32", causal=causal, layout="zigzag", B=2, H=4, Hkv=2,
                          Dk=16, Dv=16, chunk=8, valid_lens=[0, 5]))
    # bf16 K/V travel in bf16, dK/dV accumulators in float32.
    cases.append(dict(dtype="bfloat16", causal=True, layout="zigzag", B=2, H=4, Hkv=2,
                      Dk=16, Dv=16, chunk=8))
    # Logits ~1e4, exact in float32: the float64 LSE and the merge keep the rule.
    for causal, layout in ((False, "zigzag"), (True, "zigzag"), (True, "contiguous")):
        cases.append(dict(dtype="float32", causal=causal, layout=layout, B=1, H=2, Hkv=2,
                          Dk=64, Dv=8, chunk=4, logit=1e4))
    # Variants: packed documents (with padding) sharded like q/k/v, softcap, sinks.
    for dtype, causal, layout in (("float64", True, "zigzag"), ("float64", False, "contiguous"),
                                  ("float32", True, "zigzag")):
        chunk = 3 if dtype == "float64" else 8
        cases.append(dict(dtype=dtype, causal=causal, layout=layout, B=2, H=4, Hkv=2, Dk=7,
                          Dv=5, chunk=chunk, segments=True, softcap=3.0, sinks=True))
    cases.append(dict(dtype="float64", causal=True, layout="zigzag", B=2, H=4, Hkv=2, Dk=7,
                      Dv=5, chunk=3, segments=True, valid_lens=[7, 30]))
    # Also run on a 3-rank subgroup inside the 4-process launch.
    for c in cases:
        c["subgroup"] = c["dtype"] == "float64" and c["H"] != c["Hkv"] and c["layout"] == "zigzag"
    for i, c in enumerate(cases):
        vl = "" if "valid_lens" not in c else "-valid" + "_".join(map(str, c["valid_lens"]))
        vl += f"-logit{c['logit']:g}" if "logit" in c else ""
        vl += "".join(f"-{name}" for name in ("segments", "softcap", "sinks") if c.get(name))
        c["id"] = (f"{c['dtype']}-{'causal' if c['causal'] else 'full'}-{c['layout']}-"
                   f"H{c['H']}kv{c['Hkv']}-d{c['Dk']}x{c['Dv']}{vl}")
        c["seed"] = 1000 + i
    return cases


CASES = _cases()



def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "ring_case" in metafunc.fixturenames:
        metafunc.parametrize("ring_case", CASES, ids=[c["id"] for c in CASES])


@pytest.fixture(scope="session")
def ring_results(tmp_path_factory: pytest.TempPathFactory):
    """``get(P)``: rank 0's results of every case, from one launch of ``P`` ranks (cached)."""
    cache: dict[int, dict] = {}

    def get(P: int) -> dict:
        if P not in cache:
            cache[P] = launch(P, tmp_path_factory.mktemp(f"ring_p{P}"), CASES, timeout=60.0)
        return cache[P]

    return get


@pytest.fixture
def launch_ranks():
    """The launcher itself, and the exception it raises: ``(launch, RankFailure)``."""
    return launch, RankFailure


@pytest.fixture
def ring_cases() -> list[dict]:
    return CASES
