"""The dev-g rehearsal (config/lumi-rehearsal.yaml over config/lumi.yaml): the real run's rules
and architectures, one short epoch each, every GPU job on dev-g, for under 1 GPU-h."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from vcloud.config import load_model_config
from vcloud.runtime.doctor import preflight
from vcloud.runtime.lumi import Cluster
from vcloud.runtime.profile import load_workflow_config

REPO = Path(__file__).resolve().parents[2]
INPUTS = {f"train_stage{n}": {"train", "val", "wind_cache"} for n in range(4)}


def rehearsal_config() -> dict:
    config = load_workflow_config(REPO / "config/lumi.yaml", REPO / "config/lumi-rehearsal.yaml")
    config["cluster"]["account"] = "project_465000123"
    return config


def test_every_gpu_rule_runs_on_dev_g_and_the_bill_is_under_one_gpu_hour():
    config = rehearsal_config()
    models = load_model_config(REPO / config["model_config"])
    cluster = Cluster.from_config(config)
    report = preflight(
        config,
        models,
        apptainer_args=cluster.apptainer_args(),
        precommand=cluster.precommand(),
        train_inputs=INPUTS,
        memory=False,
    )
    assert [e for e in report.errors if e.startswith("resources.")] == []
    gpu_rules = [rule for rule, entry in config["resources"].items() if entry.get("gpus")]
    assert {config["resources"][rule]["partition"] for rule in gpu_rules if rule != "predict"} == {"dev-g"}
    total = next(line for line in report.lines if line.lstrip().startswith("total "))
    gpu_hours = float(total.split()[1])
    # predict is opt-in (not in the plan); without it: 4 x 15 + 4 x 10 min at 0.5 GPU-h/h.
    predict = config["resources"].get("predict")
    extra = 0.5 * predict["runtime"] / 60 if predict else 0.0
    assert gpu_hours - extra < 1.0, total
    assert abs(gpu_hours - extra - 0.5 * (4 * 15 + 4 * 10) / 60) < 0.05, total
    assert config["data"]["rois"] == ["ROIs1970/21", "ROIs2017/22", "ROIs2017/32"]
    assert config["paths"]["results"] == "results-rehearsal"


def test_the_rehearsal_trains_the_full_architectures():
    """Everything but the epoch and sample counts is full.yaml's: the memory, kernels and
    settings rehearsed are the real run's."""
    full = yaml.safe_load((REPO / "config/models/full.yaml").read_text())
    rehearsal = yaml.safe_load((REPO / "config/models/rehearsal.yaml").read_text())
    assert rehearsal.pop("name") == "rehearsal" and full.pop("name") == "full"
    for section in ("data", "stage0", "stage1", "stage2", "stage3"):
        a, b = copy.deepcopy(full[section]), copy.deepcopy(rehearsal[section])
        if "train" in a:
            assert b["train"]["epochs"] == 1
            a["train"].pop("epochs"), b["train"].pop("epochs")
        if section == "data":
            assert (b["samples_per_epoch"], b["val_samples"]) == (64, 16)
            for key in ("samples_per_epoch", "val_samples"):
                a.pop(key), b.pop(key)
        assert a == b, section
    load_model_config(REPO / "config/models/rehearsal.yaml")  # a valid model config
