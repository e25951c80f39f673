"""The `bundle` rule on a real run: the finished run's model as one file that predicts as the run did."""

from __future__ import annotations

import hashlib
import json

import pytest

from vcloud.apply.bundle import open_bundle
from vcloud.cli import main

pytestmark = [pytest.mark.workflow, pytest.mark.slow]


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_run_bundles_the_weights_it_evaluated_and_the_bundle_scores_alike(pipeline_run, tmp_path):
    work, _, real = pipeline_run
    assert real.returncode == 0, real.stderr[-3000:]
    (tar,) = (work / "results/bundle").glob("*.tar")
    store = work / "results/prepared/test.zarr"
    with open_bundle(tar, store=store) as bundle:
        card = bundle.card
        assert bundle.stages[-1] == card["default_stage"] == 3  # the shipped output
        # the very weights the run trained and evaluated, byte for byte
        for n, member in bundle.checkpoints.items():
            assert _sha(member) == _sha(work / f"results/stage{n}/best.pt"), n
        assert set(bundle.checkpoints) == {1, 2, 3}  # stage 3's predictor: the stage-1 draft refined by it
        # the card's figures are the run's own reports
        report = json.loads((work / "results/eval/stage3.json").read_text())
        for name, result in report["protocols"].items():
            if "model" in result:
                assert card["evaluation"]["3"]["protocols"][name]["mean"]["model"] == result["model"]["mean"]
    # evaluated from the bundle alone (no --config, no checkpoints), stage 3 scores as in the run
    out = tmp_path / "stage3.json"
    fixed = work / "results/eval/fixed_protocol.npz"
    assert (
        main(
            ["evaluate", "--bundle", str(tar), "--store", str(store), "--out", str(out), "--fixed-protocol", str(fixed)]
        )
        == 0
    )
    again = json.loads(out.read_text())["protocols"]
    for name, result in report["protocols"].items():
        if "model" in result:  # the same predictions; SSIM's float sums may differ in the last digits
            for metric, values in result["model"]["per_sample"].items():
                assert again[name]["model"]["per_sample"][metric] == pytest.approx(values, rel=1e-4, abs=1e-5), (
                    name,
                    metric,
                )
