"""Research runs through snakemake's dry run: experiments x seeds become targets under
results/<experiment>/seed<k>/, a stage of the same identity is trained once, one run's stage is
made by its own target, the one viewer shows compare's baseline beside the comparison, and bad
input stops the workflow before any job with one line."""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from tests.workflow.snakemake_run import run
from vcloud.cli import build_parser

pytestmark = pytest.mark.workflow

GRID = {
    "experiments": [
        {"name": "base"},
        {"name": "s3_lr", "overrides": {"stage3": {"train": {"lr": 1.0e-4}}}},
        {"name": "no_s1", "overrides": {"data": {"s1_dropout": 0.0}}},
    ],
    # Not in order, and a baseline that is not the first experiment: the viewer shows s3_lr, seed 1.
    "seeds": [1, 0],
    "compare": {"baseline": "s3_lr"},
}


def dry_run(work, config, *targets, check=True):
    (work / "grid.yaml").write_text(yaml.safe_dump(config))
    return run(
        ["-n", "-p", "--cores", "1", "-d", str(work), *targets, "--configfile", "grid.yaml"], cwd=work, check=check
    )


def job_counts(stdout: str) -> dict[str, int]:
    table = stdout.split("job ", 1)[1].split("total", 1)[0]
    return {name: int(n) for name, n in re.findall(r"^(\w+)\s+(\d+)$", table, flags=re.M)}


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    return dry_run(tmp_path_factory.mktemp("grid"), GRID).stdout


def test_each_experiment_and_seed_is_a_run_and_shared_stages_train_once(grid):
    counts = job_counts(grid)
    # 3 experiments x 2 seeds; s3_lr changes stage 3 only, so stages 0-2 are base's: 4 of each
    # (base and no_s1, two seeds), 6 stage-3 trainings; every evaluation on test and on val; data
    # prepared once, the fixed protocol detected once per split.
    assert counts["train_stage0"] == counts["train_stage2"] == 4 and counts["evaluate_stage2"] == 8, counts
    assert counts["train_stage3"] == counts["report_tables"] == 6 and counts["evaluate_stage3"] == 12, counts
    assert counts["assemble_split"] == 3 and counts["fixed_protocol"] == 2 and counts["wind_cache"] == 1, counts
    assert counts["run_config"] == 6 and counts["export_viewer"] == 1, counts
    commands = [line for line in grid.splitlines() if "vcloud train --stage 3" in line]
    s3_lr = next(line for line in commands if "--out results/s3_lr/seed1/stage3" in line)
    assert "--config results/s3_lr/seed1/model.yaml" in s3_lr, s3_lr
    assert "--stage2 results/base/seed1/stage2/best.pt" in s3_lr, s3_lr
    assert "> logs/train_stage3/s3_lr/seed1/train_stage3.log" in s3_lr, s3_lr
    # Every run reads the same prepared splits.
    assert all("--train results/prepared/train.zarr" in line for line in commands)
    # One comparison of every run's reports against the baseline, shared ones where shared.
    assert counts["compare"] == 1, counts
    compare = next(line for line in grid.splitlines() if "vcloud compare " in line)
    assert "--out results/compare.json --markdown results/compare.md --baseline s3_lr" in compare, compare
    assert "--report s3_lr 1 results/base/seed1/eval/stage2.json" in compare, compare
    assert "--report s3_lr 1 results/s3_lr/seed1/eval/stage3.json" in compare, compare
    assert "--val-report s3_lr 1 results/s3_lr/seed1/eval/stage3.val.json" in compare, compare
    evaluate = [line for line in grid.splitlines() if "vcloud evaluate --stage 3" in line]
    val = next(line for line in evaluate if "--out results/no_s1/seed0/eval/stage3.val.json" in line)
    assert "--store results/prepared/val.zarr" in val and "eval/fixed_protocol.val.npz" in val, val


def job_block(stdout: str, rule: str) -> dict[str, str]:
    """The `-p` listing of the one job of `rule`: its input, output and shell command."""
    block = stdout.split(f"rule {rule}:\n", 1)[1].split("\n\n", 1)[0]
    fields = dict(re.findall(r"^\s*(input|output): (.*)$", block, flags=re.M))
    return {**fields, "shell": block.split("Shell command: ", 1)[1] if "Shell command: " in block else ""}


def test_the_viewer_shows_compares_baseline_under_its_first_seed_beside_the_comparison(grid):
    # The baseline is not the first experiment, the first seed is not the smallest: the viewer is
    # s3_lr's seed 1, whose stages 0-2 are base's of that seed (shared) and its stage 3 its own.
    assert job_counts(grid)["export_viewer"] == 1
    assert "results/viewer/index.html" in job_block(grid, "all")["input"].split(", ")
    assert "results/viewer/index.html" in job_block(grid, "accounting")["input"].split(", ")  # it counts it
    viewer = job_block(grid, "export_viewer")
    inputs = viewer["input"].split(", ")
    for path in (
        "results/compare.json",
        "results/s3_lr/seed1/model.yaml",
        "results/base/seed1/stage1/best.pt",
        "results/base/seed1/stage2/best.pt",
        "results/s3_lr/seed1/stage3/best.pt",
        "results/base/seed1/eval/fixed_protocol.npz",
        "results/prepared/test.zarr",
    ):
        assert path in inputs, (path, inputs)
    assert viewer["output"].startswith("results/viewer/index.html, results/viewer/images")
    argv = shlex.split(viewer["shell"].split(" > ")[0])
    assert argv[:2] == ["vcloud", "export-viewer"]
    flags = {argv[i]: argv[i + 1 : i + 3] for i in range(len(argv)) if argv[i].startswith("--")}
    assert flags["--comparison"][0] == "results/compare.json" and flags["--run"] == ["s3_lr", "1"]
    assert flags["--stage3"][0] == "results/s3_lr/seed1/stage3/best.pt"
    assert flags["--stage2"][0] == "results/base/seed1/stage2/best.pt"
    assert flags["--config"][0] == "results/s3_lr/seed1/model.yaml" and flags["--out"][0] == "results/viewer"
    build_parser().parse_args(argv[1:])  # a command line vcloud takes (exits 2 otherwise)


def test_one_stage_of_one_seed_of_one_experiment_is_made_by_its_target(tmp_path):
    counts = job_counts(dry_run(tmp_path, GRID, "results/no_s1/seed1/stage1/best.pt").stdout)
    assert counts["train_stage1"] == 1 and counts["train_stage0"] == 1, counts  # stage 1 starts from stage 0
    assert "train_stage2" not in counts and counts["run_config"] == 1, counts


def test_bad_input_stops_before_any_job_with_one_line_naming_the_key(tmp_path):
    bad = {"experiments": [{"name": "a", "overrides": {"stage1": {"train": {"lrr": 1.0}}}}], "seeds": [0]}
    proc = dry_run(tmp_path, bad, check=False)
    assert proc.returncode != 0
    assert "experiments[0].overrides.stage1.train.lrr: no such key to override" in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "logs").exists()
