"""Kill harness: SIGKILL training at chosen points and at random times, resume, compare.

Each stage (0: autoencoder, 1: CFDT) is trained uninterrupted once, then again as a chain of
processes that each SIGKILL themselves at one point - inside torch.save, either side of a
rename (checkpoints and metrics.jsonl), entering validation, entering the metrics write, or
at a random time - and the next process resumes. The chain ends with a run that is not
killed. The result must equal the uninterrupted run bit for bit (best.pt and latest.pt
weights, optimizer moments) with exactly one metrics row per epoch, equal to the reference's.

Every training (the references too) is a process of its own, forked by one server that imported
torch and vcloud once (tests/kill/child.py --serve): the kills are real SIGKILLs of real
processes, and 36 processes do not each pay the import.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

from vcloud.train import checkpoint as ckpt

pytestmark = pytest.mark.kill
REPO = Path(__file__).parents[2]
EPOCHS = 3
# Deterministic metrics-row fields (timing and memory fields differ between any two runs).
SAME_KEYS = ("epoch", "loss", "lr", "best", "curriculum", "val_psnr", "val_ssim", "val_sam", "val_mae", "val_rmse")

# Where to die, at which occurrence within that process. Chained: each process resumes what the
# previous one left. Writes per epoch: latest.pt (the commit), best.pt (when improved), metrics.jsonl.
CHAIN = [
    ("save_mid", 1),  # the first latest.pt, half written
    ("after_rename", 1),  # epoch 0 committed, best.pt not yet written: re-created on resume
    ("before_rename", 2),  # a view re-created on resume, written to its temp file, not renamed
    ("after_rename", 2),  # views re-created in part, metrics.jsonl not yet rewritten
    ("metrics", 1),  # entering the metrics write at the start of a resume
    ("validation", 1),
    ("save_mid", 2),
    ("before_rename", 3),
    ("after_rename", 4),
    ("metrics", 2),
    ("after_rename", 6),
]
RANDOM_KILLS = 4
CHILD_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def harness_config(tmp_path_factory):
    config = yaml.safe_load((REPO / "tests/workflow/tiny_models.yaml").read_text())
    config["data"].update(samples_per_epoch=4, val_samples=2)
    config["stage1"]["model"]["wind_scan"] = False  # resume is under test; no wind cache file here
    config["stage1"]["init_from_stage0"] = False  # stage 1 trains alone here (no --stage0)
    for stage in ("stage0", "stage1"):
        config[stage]["train"].update(epochs=EPOCHS, batch_size=2)
    path = tmp_path_factory.mktemp("harness") / "kill.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Done:
    returncode: int
    stderr: str  # the child's output (stdout and stderr)


@pytest.fixture(scope="module")
def trainer_server():
    """tests/kill/child.py's fork server: every training of this module in a process of its own,
    forked from one that imported torch and vcloud once."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]))
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.kill.child", "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    yield server
    server.stdin.close()
    server.wait(timeout=60)


def _train(
    server, point: str, n: int, seconds: float, *, stage: int, config: Path, store: Path, out: Path, extra=()
) -> Done:
    """`vcloud train --stage STAGE ... --out OUT EXTRA` in a child of the server that SIGKILLs itself
    at `point` (tests/kill/child.py); its output in OUT.log beside OUT."""
    args = ["--stage", str(stage), "--config", str(config), "--train", str(store), "--val", str(store)]
    log = out.with_name(f"{out.name}.log")
    request = {"point": point, "n": n, "seconds": seconds, "args": [*args, "--out", str(out), *extra], "log": str(log)}
    server.stdin.write(json.dumps(request) + "\n")
    server.stdin.flush()
    ready, _, _ = select.select([server.stdout], [], [], CHILD_TIMEOUT_S)
    if not ready:  # a training that hangs: the server (and its child) go, the test fails
        server.kill()
        pytest.fail(f"no reply within {CHILD_TIMEOUT_S} s to {request}; the child's log:\n{log.read_text()[-3000:]}")
    reply = server.stdout.readline()
    assert reply, f"the trainer server ended (exit {server.poll()})"
    return Done(json.loads(reply)["returncode"], log.read_text() if log.exists() else "")


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _same_rows(rows, reference):
    assert [r["epoch"] for r in rows] == list(range(EPOCHS))
    for row, ref in zip(rows, reference):
        assert {k: row.get(k) for k in SAME_KEYS} == {k: ref.get(k) for k in SAME_KEYS}


def _same_weights(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def references(trainer_server, tiny_store, harness_config, tmp_path_factory):
    outs = {}
    for stage in (0, 1):
        out = tmp_path_factory.mktemp(f"reference{stage}") / "out"
        proc = _train(trainer_server, "none", 0, 0, stage=stage, config=harness_config, store=tiny_store, out=out)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs[stage] = out
    return outs


@pytest.mark.parametrize("stage", [0, 1])
def test_sigkill_anywhere_then_resume_ends_bit_identical(
    stage, trainer_server, tiny_store, harness_config, references, tmp_path
):
    reference = references[stage]
    rng = random.Random(1234 + stage)  # fixed: the same random kill times on every run
    kills = CHAIN + [("timer", 0, rng.uniform(0.02, 1.0)) for _ in range(RANDOM_KILLS)]
    out = tmp_path / "out"
    died = []
    for kill in kills:
        point, n, seconds = (*kill, 0.0) if len(kill) == 2 else kill
        proc = _train(trainer_server, point, n, seconds, stage=stage, config=harness_config, store=tiny_store, out=out)
        assert proc.returncode in (0, -signal.SIGKILL), (kill, proc.stderr[-3000:])
        if proc.returncode == -signal.SIGKILL:
            died.append(kill)
            if (out / "latest.pt").exists():
                ckpt.load_checkpoint(out / "latest.pt")  # never unreadable
            if (out / "metrics.jsonl").exists():
                epochs = [r["epoch"] for r in _rows(out)]
                assert epochs == list(range(len(epochs))), (kill, epochs)  # no gap, no repeat
    # The chain really was interrupted, again and again. How many of its points a 3-epoch run
    # still reaches after the earlier kills varies (8 to 11 of 15 seen on one machine): half is
    # the floor; the bit-for-bit comparison below is what the test is about.
    assert len(died) >= len(CHAIN) // 2, died
    proc = _train(trainer_server, "none", 0, 0, stage=stage, config=harness_config, store=tiny_store, out=out)
    assert proc.returncode == 0, proc.stderr[-3000:]

    latest, ref_latest = ckpt.load_checkpoint(out / "latest.pt"), ckpt.load_checkpoint(reference / "latest.pt")
    assert latest["finished"] and latest["epoch"] == EPOCHS
    _same_weights(latest["model"], ref_latest["model"])
    for key, moments in ref_latest["optimizer"]["state"].items():
        assert torch.equal(latest["optimizer"]["state"][key]["exp_avg"], moments["exp_avg"])
        assert torch.equal(latest["optimizer"]["state"][key]["exp_avg_sq"], moments["exp_avg_sq"])
    best, ref_best = ckpt.load_checkpoint(out / "best.pt"), ckpt.load_checkpoint(reference / "best.pt")
    assert best["epoch"] == ref_best["epoch"] and best["best_value"] == ref_best["best_value"]
    _same_weights(best["model"], ref_best["model"])
    _same_rows(_rows(out), _rows(reference))
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name]
    assert not (out / ".train.lock").exists()
