"""Scenes of any extent, the heavy checks: a predict killed mid-scene resumes bit for bit, and
predict's memory does not grow with the scene (a band of patches is held, not the scene)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.unit.predict_fixtures import predict_args, tiny_checkpoints
from tests.unit.scene_fixtures import prepare_args, write_scene

ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}

# Stops itself (SIGSTOP) when the 12th patch has been added: with 8 patches per output and batches
# of 3, the first output is done and on disk, the second half blended, its rows partly written.
STOP_MID_SCENE = """
import os, signal, sys
from vcloud.apply.blend import SceneBlender
from vcloud.cli import main
add, calls = SceneBlender.add, []
def add_then_stop(self, *args):
    add(self, *args)
    calls.append(1)
    if len(calls) == 12:
        os.kill(os.getpid(), signal.SIGSTOP)
SceneBlender.add = add_then_stop
sys.exit(main(sys.argv[1:]))
"""


def _stopped(proc) -> bool:
    try:
        with open(f"/proc/{proc.pid}/stat") as handle:
            return handle.read().split(") ", 1)[1].startswith("T")
    except (OSError, IndexError):
        return False


def _files(out):
    return {p.relative_to(out).as_posix(): p for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.kill  # over 10 s: docs/contributing.md, test tiers
def test_a_predict_killed_mid_scene_resumes_bit_for_bit(tmp_path):
    from vcloud.cli import main

    raw = write_scene(tmp_path / "mine", 48, 72)
    store = tmp_path / "mine.zarr"
    assert main(prepare_args(raw, store)) == 0
    ckpt = tiny_checkpoints(tmp_path / "ckpt")
    extra = ("--min-cover", "-1", "--batch-size", "3", "--draws", "2")  # batches straddle the outputs
    command = lambda out: [sys.executable, "-m", "vcloud.cli", *predict_args(store, out, ckpt, *extra)]  # noqa: E731
    reference = tmp_path / "reference"
    run = subprocess.run(command(reference), capture_output=True, text=True, env=ONE_THREAD)
    assert run.returncode == 0, run.stderr

    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", STOP_MID_SCENE, *command(out)[3:]], stdout=subprocess.DEVNULL, env=ONE_THREAD
    )
    deadline = time.monotonic() + 120
    while not _stopped(proc) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _stopped(proc), "the run did not stop mid-scene"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists()
    partial = json.loads((out / "manifest.partial.json").read_text())
    status = {name: entry["status"] for name, entry in partial["outputs"].items()}
    assert status == {
        "ROIs9000_1_s0_2019-03-01": "done",
        "ROIs9000_1_s0_2019-03-11": "pending",
        "ROIs9000_1_s0_2019-03-21": "pending",
    }
    assert not (out / "ROIs9000_1_s0_2019-03-11.tif").exists()
    assert any(".stripes.tif.tmp-" in p.name for p in out.iterdir())  # the killed scene's rows, half written

    rerun = subprocess.run(command(out), capture_output=True, text=True, env=ONE_THREAD)
    assert rerun.returncode == 0, rerun.stderr
    assert "1 already done" in rerun.stderr
    files, expected = _files(out), _files(reference)
    assert sorted(files) == sorted(expected)  # and no temporary file left behind
    for name, path in files.items():
        if name != "manifest.json":
            assert path.read_bytes() == expected[name].read_bytes(), name
    final = json.loads((out / "manifest.json").read_text())
    assert final["complete"] and final["outputs"] == json.loads((reference / "manifest.json").read_text())["outputs"]


PEAK = """
import sys, tracemalloc
from vcloud.cli import main
tracemalloc.start()
code = main(sys.argv[1:])
print("PEAK", tracemalloc.get_traced_memory()[1])
sys.exit(code)
"""


@pytest.mark.slow  # two scenes prepared and predicted: about a minute
def test_predict_memory_does_not_grow_with_the_scene(tmp_path):
    """Predict's peak of Python and numpy allocations (tracemalloc, in a fresh process) at a
    scene 8 times longer stays within 15 %; the scene's own float32 image alone would add 7 times
    the smaller one's (what a whole-scene blend would hold)."""
    from vcloud.cli import main

    ckpt = tiny_checkpoints(tmp_path / "ckpt")
    peaks = {}
    for height in (128, 1024):
        raw = write_scene(tmp_path / f"h{height}", height, 64, dates=("20190301", "20190311"), cloudy=(0,))
        store, out = tmp_path / f"h{height}.zarr", tmp_path / f"out{height}"
        assert main(prepare_args(raw, store)) == 0
        args = predict_args(store, out, ckpt, "--min-cover", "-1", "--draws", "2")
        run = subprocess.run(
            [sys.executable, "-c", PEAK, *args], capture_output=True, text=True, env=ONE_THREAD, check=False
        )
        assert run.returncode == 0, run.stderr
        peaks[height] = int(run.stdout.split("PEAK")[1])
    scene_growth = (1024 - 128) * 64 * 13 * 4  # bytes of the larger scene's extra float32 pixels
    print("peaks", peaks, "scene growth", scene_growth)
    assert peaks[1024] <= 1.15 * peaks[128], peaks
    assert peaks[1024] - peaks[128] < scene_growth / 4, peaks
