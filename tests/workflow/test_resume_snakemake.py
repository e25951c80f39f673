"""A kill anywhere at the end of train_stage1, under real snakemake, never trains the stage again.

The field case (LUMI: 24-72 GPU-hours a stage): a node failure, a preemption or a killed
snakemake in the last minutes of a stage. Snakemake marks the job's outputs incomplete and
`--rerun-incomplete` deletes them (best.pt, metrics.jsonl); the trainer must re-create them
from latest.pt - without training an epoch - and end with the weights and metrics rows of an
uninterrupted run. Each kill point starts from a stage retrained deliberately, the documented
way (docs/resume.md): latest.pt moved aside, then `-R train_stage1`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
import yaml

from tests.workflow.snakemake_run import ONE_REGION, ROOT, SNAKEMAKE

pytestmark = [pytest.mark.workflow, pytest.mark.kill]

TARGET = "results/stage1/best.pt"
STAGE = "results/stage1"
# Validation PSNR per epoch: the best is epoch 1 of 3 (best.pt last written in epoch 1), or
# every epoch improves (best.pt written at the very end, and latest.pt's model is the best).
EARLY_BEST, LATE_BEST = "1,3,2", "1,2,3"


def models_config() -> dict:
    config = yaml.safe_load((ROOT / "tests/workflow/tiny_models.yaml").read_text())
    config["data"].update(samples_per_epoch=4, val_samples=2)
    config["stage1"]["train"].update(epochs=3, batch_size=2)
    return config


def write_shim(folder, *, kill_group: bool = True) -> None:
    """`vcloud` on PATH. For `train --stage 1` while the file $KILL exists (it holds
    "POINT N SECONDS" of tests/kill/child.py, default "validation 3 0", or "exit"): die there,
    with the whole process group (snakemake included) when kill_group, or, for "exit", kill
    the group once the trainer has exited 0 (snakemake killed in its own output handling).
    $SCORES: validation PSNR by epoch (default: the best is epoch 1 of 3)."""
    folder.mkdir()
    shim = folder / "vcloud"
    child = f"{sys.executable} -m tests.kill.child"
    shim.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = train ] && [ "$3" = 1 ]; then\n'
        "  shift\n"
        f'  export VAL_PSNR_BY_EPOCH="${{SCORES:-{EARLY_BEST}}}"\n'
        '  if [ -e "$KILL" ]; then\n'
        '    point=$(cat "$KILL"); rm "$KILL"; [ -n "$point" ] || point="validation 3 0"\n'
        '    if [ "$point" = exit ]; then\n'
        f'      {child} none 0 0 -- "$@" && kill -KILL 0\n'
        "      exit 1\n"
        "    fi\n"
        f'    KILL_GROUP={int(kill_group)} exec {child} $point -- "$@"\n'
        "  fi\n"
        f'  exec {child} none 0 0 -- "$@"\n'
        "fi\n"
        f'exec {sys.executable} -m vcloud.cli "$@"\n'
    )
    shim.chmod(0o755)


def snakemake(work, env, *args, check=True, sigterm_after_mark=False):
    """snakemake in its own session; whatever is left of the group is SIGKILLed at the end."""
    proc = subprocess.Popen(
        [*SNAKEMAKE, "--cores", "2", "--configfile", "resume.yaml", "-d", str(work), *args],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=900)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the SIGKILL after a SIGTERM; jobs it left
        except ProcessLookupError:
            pass
    if check:
        assert proc.returncode == 0, out[-4000:]
    return proc.returncode, out


def rows(work) -> list[dict]:
    keep = ("epoch", "loss", "lr", "val_psnr", "val_ssim", "best", "curriculum")
    lines = (work / STAGE / "metrics.jsonl").read_text().splitlines()
    return [{k: json.loads(line).get(k) for k in keep} for line in lines]


def env_for(tmp_path, scores) -> dict:
    return dict(
        os.environ,
        PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        KILL=str(tmp_path / "kill"),
        SCORES=scores,
    )


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A work folder whose data is prepared (one region: the smallest data the chain runs on) and
    stage 1 trained once (early best)."""
    base = tmp_path_factory.mktemp("resume")
    work = base / "work"
    work.mkdir()
    (work / "models.yaml").write_text(yaml.safe_dump(models_config()))
    (work / "resume.yaml").write_text(yaml.safe_dump({**ONE_REGION, "model_config": str(work / "models.yaml")}))
    write_shim(base / "bin")
    snakemake(work, env_for(base, EARLY_BEST), TARGET)
    return work


@pytest.fixture(scope="module")
def references(prepared, tmp_path_factory):
    """{scores: (best.pt, metrics rows, seconds of the whole train_stage1 job)} of uninterrupted runs."""
    done = {EARLY_BEST: (torch.load(prepared / TARGET, weights_only=True), rows(prepared), job_seconds(prepared))}
    base = tmp_path_factory.mktemp("reference")
    work = clone(prepared, base)
    retrain(work, env_for(base, LATE_BEST))
    done[LATE_BEST] = (torch.load(work / TARGET, weights_only=True), rows(work), job_seconds(work))
    return done


def clone(prepared, base):
    work = base / "work"
    shutil.copytree(prepared, work, symlinks=True)
    shutil.copytree(prepared.parent / "bin", base / "bin")
    return work


def retrain(work, env, **kwargs):
    """The deliberate fresh start under snakemake (docs/resume.md): latest.pt aside, then -R."""
    os.replace(work / STAGE / "latest.pt", work / STAGE / "latest.before.pt")
    return snakemake(work, env, TARGET, "-R", "train_stage1", **kwargs)


def job_seconds(work) -> float:
    lines = (work / "benchmarks/train_stage1/train_stage1.tsv").read_text().splitlines()
    return float(lines[1].split("\t")[0])


KILL_POINTS = {
    # name: (validation scores, what the KILL file holds)
    "after the final best.pt": (LATE_BEST, "after_replace:best.pt 3 0"),
    "after the final latest.pt commit": (EARLY_BEST, "after_replace:latest.pt 3 0"),
    "after the final metrics row": (EARLY_BEST, "after_replace:metrics.jsonl 3 0"),
    "in snakemake's output handling": (EARLY_BEST, "exit"),
    "snakemake SIGTERM then SIGKILL as the last epoch ends": (LATE_BEST, "term_leader 3 0"),
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_kill_at_the_end_of_a_stage_never_trains_it_again(point, prepared, references, tmp_path):
    scores, kill = KILL_POINTS[point]
    work = clone(prepared, tmp_path)
    env = env_for(tmp_path, scores)
    (tmp_path / "kill").write_text(kill)
    code, said = retrain(work, env, check=False)
    assert not (tmp_path / "kill").exists()  # the kill was armed for this run
    assert code == -signal.SIGKILL, said[-3000:]  # snakemake died with its job
    latest = torch.load(work / STAGE / "latest.pt", weights_only=True)
    assert (latest["epoch"], latest["finished"]) == (3, True), point  # the last epoch was committed

    code, said = snakemake(work, env, TARGET, check=False)
    if code != 0:  # what snakemake asks for after it was killed (README: After a killed snakemake)
        assert "--rerun-incomplete" in said or "--unlock" in said, said[-3000:]
        snakemake(work, env, TARGET, "--unlock")
        snakemake(work, env, TARGET, "--rerun-incomplete")

    log = (work / "logs/train_stage1/train_stage1.log").read_text()
    assert "is finished; re-creating what is missing, training nothing" in log, log[-3000:]
    assert "stage 1 epoch" not in log and "starting fresh" not in log  # not one epoch trained
    reference, reference_rows, reference_s = references[scores]
    best = torch.load(work / TARGET, weights_only=True)
    assert (best["epoch"], best["best_value"]) == (reference["epoch"], reference["best_value"])
    assert best["model"].keys() == reference["model"].keys()
    for key, value in reference["model"].items():
        assert torch.equal(best["model"][key], value), key
    assert rows(work) == reference_rows  # one row per epoch, the same values
    print(f"{point}: rerun job {job_seconds(work):.1f} s, uninterrupted job {reference_s:.1f} s")
    assert "Nothing to be done" in snakemake(work, env, TARGET)[1]
