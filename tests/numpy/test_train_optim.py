"""attnkit.numpy.optim against torch.optim, step for step, on a parameter tree."""

from __future__ import annotations

import numpy as np
import pytest

from attnkit.numpy import MultiHeadParams
from attnkit.numpy.optim import SGD, Adam, AdamW, named_arrays

torch = pytest.importorskip("torch", reason="torch is not installed: the torch comparison needs it")

CONFIGS = {
    "sgd": (SGD, torch.optim.SGD, {"lr": 0.1}),
    "sgd-momentum": (SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "dampening": 0.1}),
    "sgd-nesterov-wd": (
        SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.01}
    ),
    "adam": (Adam, torch.optim.Adam, {"lr": 0.01}),
    "adam-wd": (Adam, torch.optim.Adam, {"lr": 0.01, "betas": (0.8, 0.99), "weight_decay": 0.1}),
    "adamw": (AdamW, torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
}


def _tree(rng: np.random.Generator) -> dict:
    return {
        "embed": rng.standard_normal((5, 4)),
        "attn": MultiHeadParams.init(4, 2, rng=rng),
        "head": [rng.standard_normal((4, 3)), rng.standard_normal(3)],
    }


@pytest.mark.parametrize("name", list(CONFIGS))
def test_optimizer_matches_torch(name) -> None:
    ours_cls, torch_cls, kwargs = CONFIGS[name]
    rng = np.random.default_rng(0)
    params = _tree(rng)
    leaves = dict(named_arrays(params))
    tparams = {n: torch.tensor(a.copy(), requires_grad=True) for n, a in leaves.items()}
    opt = ours_cls(params, **{k: v for k, v in kwargs.items()})
    topt = torch_cls(list(tparams.values()), **kwargs)
    for step in range(6):
        grads = {n: rng.standard_normal(a.shape) for n, a in leaves.items()}
        if step == 3:  # a parameter without a gradient is skipped, as torch skips grad=None
            grads["embed"] = None
            opt.lr = topt.param_groups[0]["lr"] = kwargs["lr"] / 2
        tree_grads = {
            "embed": grads["embed"],
            "attn": MultiHeadParams(
                **{n.split(".")[1]: g for n, g in grads.items() if n.startswith("attn.")}
            ),
            "head": [grads["head.0"], grads["head.1"]],
        }
        opt.step(tree_grads)
        for n, t in tparams.items():
            t.grad = None if grads[n] is None else torch.tensor(grads[n])
        topt.step()
        for n, a in named_arrays(params):
            assert np.allclose(a, tparams[n].detach().numpy(), rtol=1e-12, atol=1e-14), (n, step)
    # the arrays were updated in place: the tree still holds the same objects
    assert all(a is b for (_, a), (_, b) in zip(named_arrays(params), leaves.items()))


def test_optimizer_state_and_errors() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal(3)
    before = w.copy()
    opt = Adam({"w": w}, lr=0.1)
    opt.step({"w": np.ones(3)})
    assert opt.state["w"]["step"] == 1
    # Adam's first step moves every coordinate by lr, whatever the gradient's size
    assert np.allclose(before - w, 0.1)
    opt.reset()
    assert opt.state == {}
    with pytest.raises(ValueError, match="unknown"):
        opt.step({"v": np.ones(3)})
    with pytest.raises(ValueError, match=r"\(2,\)"):
        opt.step({"w": np.ones(2)})
    with pytest.raises(TypeError, match="int64"):
        SGD({"n": np.arange(3)}, lr=0.1)
