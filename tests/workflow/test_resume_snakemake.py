"""A killed snakemake, late in train_stage1, ends in the same stage as an uninterrupted run.

The field case: the best validation was an earlier epoch, the kill comes in the last one.
Snakemake marks best.pt incomplete and `--rerun-incomplete` deletes it; the resumed trainer
must re-create it from latest.pt instead of failing with MissingOutputException (and then,
on the next run, starting the stage from scratch). The same test checks the other half of
the contract: `-R train_stage1` on a finished stage trains it again from the start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
import yaml

from tests.workflow.snakemake_run import ROOT, SMALL, SNAKEMAKE

pytestmark = pytest.mark.workflow

TARGET = "results/stage1/best.pt"


def models_config() -> dict:
    config = yaml.safe_load((ROOT / "tests/workflow/tiny_models.yaml").read_text())
    config["data"].update(samples_per_epoch=4, val_samples=2)
    config["stage1"]["train"].update(epochs=3, batch_size=2)
    return config


def write_shim(folder, *, kill_group: bool = True) -> None:
    """`vcloud` on PATH: stage 1 validates to PSNR 1, 3, 2 (the best is epoch 1 of 3) and, while
    the file KILL exists, dies (with its snakemake when kill_group) entering its 3rd validation."""
    folder.mkdir()
    shim = folder / "vcloud"
    child = f"VAL_PSNR_BY_EPOCH=1,3,2 exec {sys.executable} -m tests.kill.child"
    shim.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = train ] && [ "$3" = 1 ]; then\n'
        "  shift\n"
        f'  if [ -e "$KILL" ]; then rm "$KILL"; KILL_GROUP={int(kill_group)} {child} validation 3 0 -- "$@"; fi\n'
        f'  {child} none 0 0 -- "$@"\n'
        "fi\n"
        f'exec {sys.executable} -m vcloud.cli "$@"\n'
    )
    shim.chmod(0o755)


def snakemake(work, env, *args, check=True):
    proc = subprocess.run(
        [*SNAKEMAKE, "--cores", "2", "--configfile", "resume.yaml", "-d", str(work), *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        start_new_session=True,
    )
    if check:
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


def rows(work) -> list[dict]:
    keep = ("epoch", "loss", "val_psnr", "best")
    lines = (work / "results/stage1/metrics.jsonl").read_text().splitlines()
    return [{k: json.loads(line)[k] for k in keep} for line in lines]


def test_killed_snakemake_late_in_train_stage1_resumes_to_the_same_weights(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "models.yaml").write_text(yaml.safe_dump(models_config()))
    (work / "resume.yaml").write_text(yaml.safe_dump({**SMALL, "model_config": str(work / "models.yaml")}))
    write_shim(tmp_path / "bin")
    env = dict(
        os.environ,
        PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        KILL=str(tmp_path / "kill"),
    )

    snakemake(work, env, TARGET)  # uninterrupted: the reference
    reference = torch.load(work / TARGET, weights_only=True)
    reference_rows = rows(work)
    assert reference["epoch"] == 2 and [row["best"] for row in reference_rows] == [True, True, False]

    (tmp_path / "kill").touch()
    killed = snakemake(work, env, TARGET, "-R", "train_stage1", check=False)
    assert killed.returncode == -signal.SIGKILL, (killed.stdout + killed.stderr)[-3000:]
    latest = torch.load(work / "results/stage1/latest.pt", weights_only=True)
    assert (latest["epoch"], latest["finished"]) == (2, False)  # -R started fresh; died in epoch 2 of 3
    assert (work / "results/stage1/.train.lock").exists()  # left by the killed trainer

    incomplete = snakemake(work, env, TARGET, check=False)
    said = incomplete.stdout + incomplete.stderr
    assert incomplete.returncode != 0 and "--rerun-incomplete" in said and TARGET in said
    snakemake(work, env, TARGET, "--unlock")  # what the README says after a killed snakemake
    snakemake(work, env, TARGET, "--rerun-incomplete")  # deletes the incomplete best.pt, reruns

    log = (work / "logs/train_stage1/train_stage1.log").read_text()
    assert "took over a stale lock" in log and "resuming from" in log and "re-creating" in log
    resumed = torch.load(work / TARGET, weights_only=True)
    assert resumed["epoch"] == reference["epoch"] and resumed["best_value"] == reference["best_value"]
    for key, value in reference["model"].items():
        assert torch.equal(resumed["model"][key], value), key
    assert rows(work) == reference_rows  # one row per epoch, the same values
    assert "Nothing to be done" in snakemake(work, env, TARGET).stdout + snakemake(work, env, TARGET).stderr
