"""``attnkit check model`` never calls an unmodified model wrong: one row per architecture of
the zoo (:mod:`attnkit.check.model.zoo`, ~50 tiny random configs: decoders, encoders,
encoder-decoders, vision and speech models), float32, a left-padded batch and one decoding
step where the model has a head (the check's loop, and ``model.generate()`` with a dynamic
and a static cache), eager, SDPA and attnkit: no error finding and every
attention module judged. An architecture the installed transformers lacks is skipped with
the reason. The full dtype x padding matrix is ``make test-models`` (tools/check_models.py).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers", reason="check model needs `pip install attnkit[transformers]`")

import torch  # noqa: E402

from attnkit.check import check_model  # noqa: E402
from attnkit.check.model.zoo import ARCHITECTURES, zoo_model  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models: intra-op threads cost ~5x the CPU time they save here (and
    oversubscribe a shared machine); restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_an_unmodified_model_has_no_error_finding(name):
    try:
        model = zoo_model(name)
    except LookupError as err:
        pytest.skip(str(err))
    arch = ARCHITECTURES[name]
    report = check_model(model, implementations=["eager", "sdpa", "attnkit"], length=8,
                         generate=1 if arch.head else 0, padding="left", progress=False,
                         generate_api=True)
    assert report.ok, report.table(reproducers=False)
    assert not [f for r in report.implementations for f in r.findings if f.is_error]
    eager = report.implementations[0]
    assert eager.status == "ran" and eager.layers
    assert all(row.calls >= 1 and row.verdict == "ok" for row in eager.layers), eager.layers
