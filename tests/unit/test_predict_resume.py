"""`vcloud predict` SIGKILLed after its first output, then run again with the same command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit.predict_fixtures import predict_args, tiny_checkpoints

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors on a shared machine

# Every date with an S2 image (8 outputs), one image per batch: the kill lands mid-run.
EXTRA = ("--min-cover", "-1", "--batch-size", "1", "--draws", "2")


def _command(store, out, ckpt) -> list[str]:
    return [sys.executable, "-m", "vcloud.cli", *predict_args(store, out, ckpt, *EXTRA)]


# The run to be killed stops itself (SIGSTOP) as soon as its first partial manifest is written,
# i.e. once the first batch's files are whole: the SIGKILL then lands mid-run every time. Timed by
# polling alone, a run could finish before the kill, and the test used to skip then.
STOP_AFTER_FIRST_BATCH = """
import os, signal, sys
import vcloud.apply.run as run
from vcloud.cli import main
write = run.write_manifest
def write_then_stop(out, manifest, *, final=False):
    write(out, manifest, final=final)
    if not final:
        os.kill(os.getpid(), signal.SIGSTOP)
run.write_manifest = write_then_stop
sys.exit(main(sys.argv[1:]))
"""

# As above, but the stop comes after the first output of this run's own request: a run into a
# folder with an earlier manifest writes its partial manifest before any output too.
STOP_AFTER_FIRST_NEW_OUTPUT = """
import os, signal, sys
import vcloud.apply.run as run
from vcloud.cli import main
write = run.write_manifest
def write_then_stop(out, manifest, *, final=False):
    write(out, manifest, final=final)
    mine = [e for e in manifest["outputs"].values() if e.get("request_id") == manifest["request_id"]]
    if not final and any(e["status"] == "done" for e in mine):
        os.kill(os.getpid(), signal.SIGSTOP)
run.write_manifest = write_then_stop
sys.exit(main(sys.argv[1:]))
"""


ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}  # as the one_thread fixture, in the child


def _stopped(proc) -> bool:
    """The process has stopped itself (state T in /proc)."""
    try:
        return Path(f"/proc/{proc.pid}/stat").read_text().split(") ", 1)[1].startswith("T")
    except (OSError, IndexError):
        return False


def _files(out):
    return {p.relative_to(out).as_posix(): p for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.kill  # over 10 s: docs/contributing.md, test tiers
def test_killed_run_resumes_with_identical_files_redoing_only_unfinished(tiny_store, tmp_path):
    from vcloud.cli import main

    ckpt = tiny_checkpoints(tmp_path / "ckpt")
    reference = tmp_path / "reference"
    assert main(predict_args(tiny_store, reference, ckpt, *EXTRA)) == 0

    out = tmp_path / "out"
    stopping = [sys.executable, "-c", STOP_AFTER_FIRST_BATCH, *predict_args(tiny_store, out, ckpt, *EXTRA)]
    log = tmp_path / "killed-run.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(stopping, stdout=subprocess.DEVNULL, stderr=stderr, env=ONE_THREAD)
    deadline = time.monotonic() + 120
    while not (out / "manifest.partial.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)  # the manifest appears once the first batch's files are whole
    os.kill(proc.pid, signal.SIGKILL)  # stopped after its first batch, or about to stop: it cannot finish
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, log.read_text()[-2000:]
    assert (out / "manifest.partial.json").exists() and not (out / "manifest.json").exists(), log.read_text()[-2000:]
    manifest = json.loads((out / "manifest.partial.json").read_text())
    done = [name for name, entry in manifest["outputs"].items() if entry["status"] == "done"]
    assert len(done) == 1  # the first batch (one image), every time
    kept = {
        path: (p.stat().st_ino, p.stat().st_mtime_ns)
        for path, p in _files(out).items()
        if any(path.startswith(name) for name in done)
    }
    assert kept

    rerun = subprocess.run(_command(tiny_store, out, ckpt), capture_output=True, text=True, env=ONE_THREAD)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(done)} already done" in rerun.stderr
    files, expected = _files(out), _files(reference)
    assert sorted(files) == sorted(expected)  # and no temporary file left behind
    for name, path in files.items():
        if name != "manifest.json":
            assert path.read_bytes() == expected[name].read_bytes(), name
    for path, stamp in kept.items():  # finished outputs were not written again
        assert (files[path].stat().st_ino, files[path].stat().st_mtime_ns) == stamp, path
    final = json.loads((out / "manifest.json").read_text())
    assert final["complete"] and final["outputs"] == json.loads((reference / "manifest.json").read_text())["outputs"]


def test_a_damaged_output_is_made_again(tiny_store, tmp_path):
    """Resume trusts checksums, not existence: a finished file changed on disk is redone."""
    from vcloud.cli import main

    ckpt = tiny_checkpoints(tmp_path / "ckpt")
    out = tmp_path / "out"
    args = predict_args(tiny_store, out, ckpt, "--dates", "2018-05-17")
    assert main(args) == 0
    target = out / "ROIs1868_119_p0_2018-05-17.tif"
    good = target.read_bytes()
    target.write_bytes(good[:-10])
    other = out / "ROIs1868_119_p1_2018-05-17.tif"
    stamp = other.stat().st_mtime_ns
    assert main(args) == 0
    assert target.read_bytes() == good and other.stat().st_mtime_ns == stamp


@pytest.mark.kill  # over 10 s: docs/contributing.md, test tiers
def test_a_finished_run_redone_with_other_settings_and_killed_leaves_no_complete_manifest(tiny_store, tmp_path):
    """A finished run's manifest.json names every output as done. Run again into the same folder
    with other settings and killed after its first batch, the folder must not keep that manifest
    claiming a complete run over files the new run has changed; its partial manifest says what is
    done and what is pending, and the same command then finishes it."""
    from vcloud.cli import main

    ckpt = tiny_checkpoints(tmp_path / "ckpt")
    out = tmp_path / "out"
    assert main(predict_args(tiny_store, out, ckpt, *EXTRA)) == 0
    assert json.loads((out / "manifest.json").read_text())["complete"]
    other = ("--min-cover", "-1", "--batch-size", "1", "--draws", "3")  # other settings: every output redone
    stopping = [sys.executable, "-c", STOP_AFTER_FIRST_NEW_OUTPUT, *predict_args(tiny_store, out, ckpt, *other)]
    proc = subprocess.Popen(stopping, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ONE_THREAD)
    deadline = time.monotonic() + 120
    while not _stopped(proc) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # stopped after its first output, with the old manifest.json gone or not
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists()  # before: the old one stayed, claiming a complete run
    partial = json.loads((out / "manifest.partial.json").read_text())
    statuses = [entry["status"] for entry in partial["outputs"].values()]
    assert not partial["complete"] and statuses.count("done") == 1 and "pending" in statuses
    rerun = subprocess.run(
        [sys.executable, "-m", "vcloud.cli", *predict_args(tiny_store, out, ckpt, *other)],
        capture_output=True,
        text=True,
        env=ONE_THREAD,
    )
    assert rerun.returncode == 0, rerun.stderr
    final = json.loads((out / "manifest.json").read_text())
    assert final["complete"] and final["request"]["draws"] == 3 and not (out / "manifest.partial.json").exists()
