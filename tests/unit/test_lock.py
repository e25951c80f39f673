"""The lock on a training output folder: one holder, named; stale locks taken over only when certain."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from vcloud.train.lock import LOCK_NAME, LockHeld, OutputLock


def _write_lock(folder, **holder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_NAME).write_text(json.dumps({"token": "theirs", "since": "2026-11-23T08:00:00Z", **holder}))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_second_holder_fails_with_one_line_naming_folder_and_holder(tmp_path):
    first = OutputLock(tmp_path / "out", environ={"SLURM_JOB_ID": "4242"})
    first.acquire()
    with pytest.raises(LockHeld) as err:
        OutputLock(tmp_path / "out", environ={}).acquire()
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'out'}: another training run holds this folder")
    assert f"host {socket.gethostname()}, pid {os.getpid()}, SLURM job 4242" in message
    first.release()
    assert not (tmp_path / "out" / LOCK_NAME).exists()
    with OutputLock(tmp_path / "out", environ={}):  # free again
        assert (tmp_path / "out" / LOCK_NAME).exists()


def test_live_process_on_this_host_keeps_its_lock(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write_lock(tmp_path, host=socket.gethostname(), pid=sleeper.pid, slurm_job_id=None)
        with pytest.raises(LockHeld, match=f"pid {sleeper.pid}"):
            OutputLock(tmp_path, environ={}).acquire()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_stale_lock_of_a_dead_process_on_this_host_is_taken_over(tmp_path, caplog):
    _write_lock(tmp_path, host=socket.gethostname(), pid=_dead_pid(), slurm_job_id=None)
    lock = OutputLock(tmp_path, environ={})
    lock.acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert "took over a stale lock" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]  # nothing set aside is left
    lock.release()


def test_reused_pid_is_not_mistaken_for_the_holder(tmp_path):
    # Our own pid, but a start time that is not ours: the holder died and the pid was reused.
    _write_lock(tmp_path, host=socket.gethostname(), pid=os.getppid(), start="1", slurm_job_id=None)
    with OutputLock(tmp_path, environ={}) as lock:
        assert lock.held


def test_other_host_is_refused_unless_its_slurm_job_is_known_to_be_over(tmp_path, monkeypatch):
    _write_lock(tmp_path, host="nid005001", pid=123, slurm_job_id="777")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    squeue.write_text("#!/bin/sh\necho RUNNING\n")
    squeue.chmod(0o755)
    with pytest.raises(LockHeld, match="host nid005001, pid 123, SLURM job 777"):
        OutputLock(tmp_path, environ={}).acquire()
    squeue.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
    with OutputLock(tmp_path, environ={}) as lock:
        assert lock.held


def test_same_slurm_job_restarted_takes_over(tmp_path):
    # A requeued job keeps its id and may land on another node: the old run cannot be alive.
    _write_lock(tmp_path, host="nid005001", pid=123, slurm_job_id="888")
    with OutputLock(tmp_path, environ={"SLURM_JOB_ID": "888"}) as lock:
        assert lock.held


def test_unreadable_lock_is_left_for_a_person(tmp_path):
    (tmp_path / LOCK_NAME).write_text("{not json")
    with pytest.raises(LockHeld, match=f"remove {tmp_path / LOCK_NAME} if that run is gone"):
        OutputLock(tmp_path, environ={}).acquire()
