"""The reproducer of a finding on a custom kernel registered with ``AttentionInterface``
runs as printed in a fresh interpreter: it registers the function from its file, and the
module it calls the function with carries the module's own tensors and settings
(``module.sinks``), so it fails on the finding, never with an ``AttributeError``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_custom_kernels import sinks_from_module_unscaled  # noqa: E402
from transformers import AttentionInterface  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: E402

from attnkit.check import check_model  # noqa: E402
from attnkit.check.model.load import tiny_model  # noqa: E402


def test_a_custom_kernel_reading_module_sinks_has_a_reproducer_that_runs(tmp_path) -> None:
    AttentionInterface.register("custom-sinks-unscaled", sinks_from_module_unscaled)
    AttentionMaskInterface.register("custom-sinks-unscaled", sdpa_mask)
    report = check_model(tiny_model("gpt_oss"), implementations=["custom-sinks-unscaled"],
                         save_to=tmp_path, padding="none")
    assert "wrong-scale" in report.codes, report.text()
    f = next(f for f in report.implementations[0].findings if f.reproducer)
    assert "model_custom_kernels.py:sinks_from_module_unscaled" in f.reproducer, f.reproducer
    script = tmp_path / "repro.py"
    script.write_text(f.reproducer + "\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 1 and f"AssertionError: {f.code}" in done.stderr, \
        done.stderr[-600:]
