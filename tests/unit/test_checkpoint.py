"""Checkpoints: atomic save, pickle-free load, RNG round trip, resume rule, stop signals."""

from __future__ import annotations

import logging
import os
import random
import signal
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from vcloud.errors import BadInputError
from vcloud.train import checkpoint as ck


def _state(*, config_hash: str = "abc123", finished: bool = False, **extra) -> dict:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return {
        **ck.checkpoint_meta(stage=1, config_hash=config_hash),
        "finished": finished,
        "epoch": 3,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        **extra,
    }


def test_save_load_round_trip_with_optimizer_state(tmp_path):
    state = _state()
    path = tmp_path / "deep" / "stage1" / "latest.pt"  # parents are created
    ck.save_checkpoint(path, state)
    loaded = ck.load_checkpoint(path)
    assert loaded["epoch"] == 3 and loaded["finished"] is False
    assert torch.equal(loaded["model"]["weight"], state["model"]["weight"])
    assert loaded["optimizer"]["param_groups"][0]["betas"] == state["optimizer"]["param_groups"][0]["betas"]
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    assert [p.name for p in path.parent.iterdir()] == ["latest.pt"]  # no temp file left


def test_meta_records_provenance():
    meta = ck.checkpoint_meta(stage=2, config_hash="deadbeef")
    assert meta["format_version"] == ck.FORMAT_VERSION
    assert meta["stage"] == 2 and meta["config_hash"] == "deadbeef"
    assert meta["vcloud_version"] and meta["git_revision"]
    assert type(meta["torch_version"]) is str  # TorchVersion would not load with weights_only
    assert meta["created_utc"].endswith("+00:00")


def test_failed_save_keeps_old_checkpoint_and_removes_temp(tmp_path, monkeypatch):
    path = tmp_path / "latest.pt"
    ck.save_checkpoint(path, _state())
    before = path.read_bytes()

    def broken_save(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(ck.torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        ck.save_checkpoint(path, _state(finished=True))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["latest.pt"]


@pytest.mark.parametrize(
    ("value", "where"),
    [
        (np.float64(0.5), "state['metrics']['psnr']"),
        (torch.__version__, "state['metrics']['psnr']"),  # a str subclass
        (Path("x"), "state['metrics']['psnr']"),
    ],
)
def test_save_refuses_values_weights_only_cannot_load(tmp_path, value, where):
    path = tmp_path / "latest.pt"
    with pytest.raises(TypeError) as err:
        ck.save_checkpoint(path, _state(metrics={"psnr": value}))
    assert where in str(err.value)
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_missing_truncated_and_foreign_files_raise_one_line(tmp_path):
    missing = tmp_path / "nope.pt"
    with pytest.raises(BadInputError, match="nope.pt: checkpoint not found"):
        ck.load_checkpoint(missing)

    good = tmp_path / "good.pt"
    ck.save_checkpoint(good, _state())
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint at all")
    pickled = tmp_path / "pickled.pt"
    torch.save({"format_version": ck.FORMAT_VERSION, "path": Path("x")}, pickled)
    for bad in (truncated, garbage, pickled):
        with pytest.raises(BadInputError) as err:
            ck.load_checkpoint(bad)
        message = str(err.value)
        assert message.startswith(f"{bad}: not a readable checkpoint") and "\n" not in message


def test_other_format_version_or_no_meta_raise(tmp_path):
    old = tmp_path / "old.pt"
    state = _state()
    state["format_version"] = ck.FORMAT_VERSION + 1
    ck.save_checkpoint(old, state)
    with pytest.raises(BadInputError, match=r"old.pt: checkpoint format_version 2, this vcloud reads 1"):
        ck.load_checkpoint(old)
    bare = tmp_path / "bare.pt"
    torch.save({"model": {}}, bare)
    with pytest.raises(BadInputError, match=r"bare.pt: not a vcloud checkpoint \(no format_version\)"):
        ck.load_checkpoint(bare)


def _draw() -> tuple:
    return (
        [random.random() for _ in range(3)] + [random.gauss(0, 1)],
        np.random.rand(3).tolist() + [np.random.standard_normal()],
        torch.rand(3).tolist() + torch.randn(1).tolist(),
    )


def test_rng_state_round_trip_through_weights_only_file(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1), np.random.standard_normal()  # leave cached gaussians in both states
    state = ck.capture_rng_state()
    expected = _draw()

    path = tmp_path / "latest.pt"
    ck.save_checkpoint(path, {**ck.checkpoint_meta(stage=0, config_hash="h"), "rng": state})
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    assert _draw() != expected
    ck.restore_rng_state(ck.load_checkpoint(path)["rng"])
    assert _draw() == expected


def _write(path: Path, *, config_hash: str = "h1", finished: bool = False) -> None:
    ck.save_checkpoint(path, _state(config_hash=config_hash, finished=finished))


def test_resume_decision_rules(tmp_path, caplog):
    latest, best = tmp_path / "latest.pt", tmp_path / "best.pt"
    caplog.set_level(logging.INFO, logger=ck.__name__)

    assert ck.resume_decision(latest, best, "h1") == "fresh"  # nothing yet

    _write(latest, config_hash="h1", finished=False)
    assert ck.resume_decision(latest, best, "h1") == "resume"  # interrupted before any best.pt
    best.write_bytes(b"x")
    assert ck.resume_decision(latest, best, "h1") == "resume"  # interrupted

    _write(latest, config_hash="h1", finished=True)
    assert ck.resume_decision(latest, best, "h1") == "resume"  # done; trainer exits quickly
    best.unlink()  # what snakemake does to an incomplete job's outputs, and -R
    assert ck.resume_decision(latest, best, "h1") == "resume"  # re-created from latest.pt, never retrained
    assert latest.exists()


def test_another_identity_is_set_aside_with_one_line_naming_both(tmp_path, caplog):
    latest, best = tmp_path / "latest.pt", tmp_path / "best.pt"
    caplog.set_level(logging.INFO, logger=ck.__name__)
    _write(latest, config_hash="0123456789abcdef", finished=False)
    before = latest.read_bytes()

    assert ck.resume_decision(latest, best, "h2", may_write=False) == "fresh"  # a DDP rank > 0
    assert latest.read_bytes() == before
    caplog.clear()
    assert ck.resume_decision(latest, best, "fedcba9876543210") == "fresh"
    assert not latest.exists()
    assert (tmp_path / "latest.01234567.pt").read_bytes() == before  # kept, not deleted
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "0123456789abcdef" in lines[0] and "fedcba9876543210" in lines[0]

    _write(latest, config_hash="0123456789abcdef", finished=True)  # the same identity again
    assert ck.resume_decision(latest, best, "0123456789abcdef", fresh=True) == "fresh"  # vcloud train --fresh
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.01234567.2.pt", "latest.01234567.pt"]


def test_resume_key_is_the_config_hash_without_upstream_and_changes_with_upstream_weights():
    assert ck.resume_key("h1") == ck.resume_key("h1", {}) == "h1"
    key = ck.resume_key("h1", {1: "aaaa"})
    assert key != "h1" and key == ck.resume_key("h1", {1: "aaaa"})
    assert ck.resume_key("h1", {1: "bbbb"}) != key
    assert ck.resume_key("h2", {1: "aaaa"}) != key
    assert ck.resume_key("h1", {1: "aaaa", 2: "cccc"}) != key


def test_weights_digest_sees_the_weights_not_the_file(tmp_path):
    weights = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(2, dtype=torch.bfloat16)}
    ck.save_checkpoint(tmp_path / "a.pt", {**ck.checkpoint_meta(stage=1, config_hash="x"), "model": weights})
    ck.save_checkpoint(
        tmp_path / "b.pt", {**ck.checkpoint_meta(stage=1, config_hash="y"), "epoch": 9, "model": weights}
    )
    assert (tmp_path / "a.pt").read_bytes() != (tmp_path / "b.pt").read_bytes()
    assert ck.weights_digest(tmp_path / "a.pt") == ck.weights_digest(tmp_path / "b.pt")
    changed = {**weights, "w": weights["w"].clone()}
    changed["w"][1, 2] += 1e-6
    ck.save_checkpoint(tmp_path / "c.pt", {**ck.checkpoint_meta(stage=1, config_hash="x"), "model": changed})
    assert ck.weights_digest(tmp_path / "c.pt") != ck.weights_digest(tmp_path / "a.pt")
    reshaped = {**weights, "w": weights["w"].reshape(3, 2)}
    ck.save_checkpoint(tmp_path / "d.pt", {**ck.checkpoint_meta(stage=1, config_hash="x"), "model": reshaped})
    assert ck.weights_digest(tmp_path / "d.pt") != ck.weights_digest(tmp_path / "a.pt")


def test_resume_decision_refuses_unreadable_latest(tmp_path):
    latest = tmp_path / "latest.pt"
    latest.write_bytes(b"garbage")
    with pytest.raises(BadInputError, match="latest.pt"):
        ck.resume_decision(latest, tmp_path / "best.pt", "h1")


def test_stop_request_sets_flag_and_restores_handlers():
    sentinel = []
    term_before = signal.getsignal(signal.SIGTERM)
    previous = signal.signal(signal.SIGUSR1, lambda s, f: sentinel.append(s))
    try:
        with ck.StopRequest() as stop:
            assert not stop.requested and stop.signal_name is None
            os.kill(os.getpid(), signal.SIGUSR1)
            assert stop.requested and stop.signal_name == "SIGUSR1"
            os.kill(os.getpid(), signal.SIGTERM)  # handled too; the first signal is kept
            assert stop.signal_name == "SIGUSR1"
        assert sentinel == []
        os.kill(os.getpid(), signal.SIGUSR1)  # the earlier handler is back
        assert sentinel == [signal.SIGUSR1]
        assert signal.getsignal(signal.SIGTERM) == term_before
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_ordered_dict_model_state_is_accepted(tmp_path):
    state = {**ck.checkpoint_meta(stage=0, config_hash="h"), "model": OrderedDict(w=torch.ones(2))}
    ck.save_checkpoint(tmp_path / "a.pt", state)
    assert torch.equal(ck.load_checkpoint(tmp_path / "a.pt")["model"]["w"], torch.ones(2))
