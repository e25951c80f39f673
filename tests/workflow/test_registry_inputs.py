"""The workflow's rules take and pass exactly the checkpoints the stage registry declares."""

from __future__ import annotations

import re

import pytest

from tests.workflow.snakemake_run import ROOT, run
from vcloud.config import load_model_config
from vcloud.registry import STAGES, get_stage

pytestmark = pytest.mark.workflow


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    """rule name -> its output line and shell command in a dry run of the default config (which
    scans by wind)."""
    work = tmp_path_factory.mktemp("dry")
    proc = run(["-n", "-p", "--cores", "1", "-d", str(work)], cwd=work)
    found, rule = {}, None
    for line in map(str.strip, proc.stdout.splitlines()):
        if match := re.match(r"(?:local)?rule (\w+):", line):
            rule = match.group(1)
        elif rule and line.startswith("output:"):
            found[f"{rule} output"] = line
        elif rule and "vcloud " in line and rule not in found:
            found[rule] = line
    return found


def flags(command: str) -> dict[int, str]:
    return {int(n): path for n, path in re.findall(r"--stage(\d+) (\S+)", command)}


def best(n: int) -> str:
    return f"results/{get_stage(n).folder}/best.pt"


@pytest.mark.slow  # over 10 s: docs/contributing.md, test tiers
def test_each_rule_passes_the_registry_checkpoints_by_path(commands):
    default = load_model_config(ROOT / "config/models/small.yaml")  # the default config's model set
    for stage in STAGES:
        train = commands[stage.train_rule]
        assert flags(train) == {n: best(n) for n in stage.builds_on(default)}, train
        assert ("--wind-cache" in train) == stage.reads_wind, train
        # report_curves reads metrics.jsonl: the training rule declares it.
        assert f"results/{stage.folder}/metrics.jsonl" in commands[f"{stage.train_rule} output"]
        evaluate = commands[stage.evaluate_rule]
        assert flags(evaluate) == {n: best(n) for n in stage.predictor_needs}, evaluate
        assert "--results" not in evaluate
        assert "--fixed-protocol results/eval/fixed_protocol.npz" in evaluate, evaluate
    viewer = commands["export_viewer"]
    # stage 0 is trained and scored, but no later stage nor the viewer reads its weights
    assert flags(viewer) == {n: best(n) for n in (1, 2, 3)}, viewer
    assert all(0 not in (*stage.upstream, *stage.predictor_needs) for stage in STAGES[1:])
    assert "--fixed-protocol results/eval/fixed_protocol.npz" in viewer, viewer
    # Detected once, on the test split, for all of them.
    fixed = commands["fixed_protocol"]
    assert "--store results/prepared/test.zarr" in fixed and "--out results/eval/fixed_protocol.npz" in fixed, fixed
    assert "--threads 1" in fixed, fixed  # the rule's threads: resources.fixed_protocol's 2, capped by --cores 1
    curves = commands["report_curves"]
    assert all(f"results/{stage.folder}/metrics.jsonl" in curves for stage in STAGES), curves
