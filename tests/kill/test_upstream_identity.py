"""An interrupted stage 2 resumes only against the stage-1 weights it trained with.

Stage 1 is trained, stage 2 is SIGKILLed in its last epoch. Rerun against the same stage-1
best.pt, it resumes; against stage-1 weights that changed meanwhile (retrained, any reason),
its latest.pt belongs to another identity: set aside (renamed, kept), one log line naming
both identities, and stage 2 trains from the start.
"""

from __future__ import annotations

import json
import shutil
import signal

import pytest
import torch
import yaml

from tests.kill.test_kill_harness import REPO, _train, trainer_server  # noqa: F401 - the server fixture
from vcloud.train import checkpoint as ckpt

pytestmark = pytest.mark.kill


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    config = yaml.safe_load((REPO / "tests/workflow/tiny_models.yaml").read_text())
    config["data"].update(samples_per_epoch=4, val_samples=2)
    config["stage1"]["model"]["wind_scan"] = False  # no wind cache file here
    config["stage1"]["init_from_stage0"] = False  # stage 1 trains alone here (no --stage0)
    config["stage1"]["train"].update(epochs=1, batch_size=2)
    config["stage2"]["train"].update(epochs=2, batch_size=2)
    path = tmp_path_factory.mktemp("identity") / "models.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _stage2(server, point, n, *, config, store, out, stage1, extra=()):
    """`vcloud train --stage 2` in a child that SIGKILLs itself at `point` (tests/kill/child.py)."""
    return _train(
        server, point, n, 0.0, stage=2, config=config, store=store, out=out, extra=["--stage1", str(stage1), *extra]
    )


def test_upstream_weights_changed_while_stage2_was_interrupted_start_it_fresh(
    trainer_server,  # noqa: F811 - the fixture
    config,
    tiny_store,
    tmp_path,
):
    stage1 = tmp_path / "stage1"
    proc = _train(trainer_server, "none", 0, 0.0, stage=1, config=config, store=tiny_store, out=stage1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stage1_best = stage1 / "best.pt"

    out = tmp_path / "stage2"
    # Validations: before training (-1), epoch 0, epoch 1: die entering the last one.
    proc = _stage2(trainer_server, "validation", 3, config=config, store=tiny_store, out=out, stage1=stage1_best)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    interrupted = ckpt.load_checkpoint(out / "latest.pt")
    assert (interrupted["epoch"], interrupted["finished"]) == (1, False)
    old_key = interrupted["resume_key"]
    assert interrupted["config"]["upstream_weights"] == {"stage1": ckpt.weights_digest(stage1_best)}

    same = tmp_path / "same"  # control: the same stage-1 weights resume the interrupted run
    shutil.copytree(out, same)
    proc = _stage2(trainer_server, "none", 0, config=config, store=tiny_store, out=same, stage1=stage1_best)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming interrupted run" in proc.stderr and "starting fresh" not in proc.stderr
    assert [p.name for p in same.glob("latest*.pt")] == ["latest.pt"]

    # Stage 1 retrained meanwhile: other weights (here one value moved), the same settings.
    state = ckpt.load_checkpoint(stage1_best)
    name = next(iter(state["model"]))
    state["model"][name] = state["model"][name] + 1e-3
    ckpt.save_checkpoint(stage1_best, state)
    proc = _stage2(trainer_server, "none", 0, config=config, store=tiny_store, out=out, stage1=stage1_best)
    assert proc.returncode == 0, proc.stderr[-3000:]

    kept = out / f"latest.{old_key[:8]}.pt"
    assert sorted(p.name for p in out.glob("latest*.pt")) == sorted(["latest.pt", kept.name])
    aside = ckpt.load_checkpoint(kept)  # the interrupted run, intact
    assert (aside["resume_key"], aside["epoch"], aside["finished"]) == (old_key, 1, False)
    for key, value in interrupted["model"].items():
        assert torch.equal(aside["model"][key], value), key
    new = ckpt.load_checkpoint(out / "latest.pt")
    assert new["finished"] and new["resume_key"] != old_key
    lines = [line for line in proc.stderr.splitlines() if "set aside" in line]
    assert len(lines) == 1 and old_key in lines[0] and new["resume_key"] in lines[0], proc.stderr[-3000:]
    assert "resuming" not in proc.stderr
    epochs = [json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [-1, 0, 1]  # trained from the start: the initial validation, then both epochs

    # Finished, same identity: only `vcloud train --fresh` trains it again, keeping the old one aside.
    proc = _stage2(
        trainer_server, "none", 0, config=config, store=tiny_store, out=out, stage1=stage1_best, extra=["--fresh"]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "a fresh start was asked for" in proc.stderr and "stage 2 epoch 1" in proc.stderr
    finished_aside = ckpt.load_checkpoint(out / f"latest.{new['resume_key'][:8]}.pt")
    assert finished_aside["finished"] and finished_aside["resume_key"] == new["resume_key"]
    assert ckpt.load_checkpoint(out / "latest.pt")["finished"]
