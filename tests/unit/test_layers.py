"""Evaluation, `vcloud predict` and the viewer read a stage's predictor without importing training."""

from __future__ import annotations

import subprocess
import sys

import pytest

READERS = ("vcloud.evaluation.predict", "vcloud.evaluation.evaluate", "vcloud.evaluation.protocols",
           "vcloud.export.viewer", "vcloud.pipeline", "vcloud.weights")  # fmt: skip


@pytest.mark.parametrize("module", READERS)
def test_reading_a_stage_imports_no_training(module):
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith('vcloud.train')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"{module} imports {out.strip()}"


def test_the_builders_still_name_what_moved():
    from vcloud import pipeline, weights
    from vcloud.train import checkpoint, stages

    assert stages.RefinerPipeline is pipeline.RefinerPipeline and stages.load_frozen is weights.load_frozen
    assert checkpoint.load_checkpoint is weights.load_checkpoint
