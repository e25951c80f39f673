"""`vcloud predict` on a store whose dates mostly lack S1: those dates are inputs like any other
(S1 zeroed, `s1_valid` False), as the samplers use them, not skipped for the target repeated."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.conftest import TINY, TINY_ROIS
from tests.unit.predict_fixtures import predict_args, tiny_checkpoints

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors on a shared machine

WITH_S1 = 0  # the only time index that keeps its S1 images (both locations)


@pytest.fixture(scope="module")
def store(tiny_raw_master, tmp_path_factory):
    from vcloud.data.prepare import prepare_roi

    folder = tmp_path_factory.mktemp("s1_missing")
    raw = folder / "raw"
    shutil.copytree(tiny_raw_master, raw)
    for t in range(TINY["times"]):
        if t != WITH_S1:
            shutil.rmtree(raw / f"ROIs1868/119/S1/{t}")
    out = folder / "store.zarr"
    prepare_roi(raw=raw, roi=TINY_ROIS[0], out=out, times=TINY["times"], size=TINY["size"])
    return out


def test_dates_without_s1_are_chosen_as_inputs(store):
    from vcloud.apply.plan import plan_jobs, read_batch, roi_names
    from vcloud.data.series import choose_context
    from vcloud.data.shards import ShardReader

    reader = ShardReader(store)
    assert reader.valid_s2.all() and reader.valid_s1[:, WITH_S1].all() and reader.valid_s1.sum() == len(reader)
    jobs = plan_jobs(reader, rois=roi_names(reader), input_dates=3, min_cover=-1.0)
    assert len(jobs) == reader.valid_s2.sum()  # every date is a target
    cover = np.nan_to_num(reader.cloud_cover, nan=1.0)
    for job in jobs:
        others = [t for t in job.inputs if t != job.time]
        assert len(set(job.inputs)) == 3, job  # 4 dates with S2: no date repeated, the target least of all
        days = reader.date_s2[job.location].astype("datetime64[D]").astype(np.int64)
        chosen = choose_context(
            days, cover[job.location], reader.valid_s2[job.location], job.time, 3, policy="clearest", window_days=30
        )
        assert job.inputs == chosen.dates and job.fallback == chosen.fallback  # the context policy, S1 or not
        assert not reader.valid_s1[job.location, others].all()  # at most one of the others has S1
    target_with_s1 = next(j for j in jobs if j.time == WITH_S1)  # before: its only context was itself
    assert not reader.valid_s1[target_with_s1.location, [t for t in target_with_s1.inputs if t != WITH_S1]].any()

    batch = read_batch(reader, jobs)
    s1_valid = batch.tensors["s1_valid"]  # (B, T)
    assert s1_valid.shape == (len(jobs), 3)
    for i, job in enumerate(jobs):
        np.testing.assert_array_equal(s1_valid[i].numpy(), reader.valid_s1[job.location, list(job.inputs)])
        assert bool(batch.tensors["target_s1_valid"][i]) == (job.time == WITH_S1)
    x = batch.tensors["x"]  # (B, T, 17, H, W): S2 13, S1 2, S1 validity 1, cloud probability 1
    assert not x[:, :, 13:15][~s1_valid].any()  # S1 zeros where missing
    assert x[:, :, 13:15][s1_valid].any()


def test_predict_writes_outputs_made_from_dates_without_s1(store, tmp_path):
    from vcloud.cli import main
    from vcloud.data.shards import ShardReader

    ckpt = tiny_checkpoints(tmp_path / "ckpt")  # data.input_dates 2
    out = tmp_path / "out"
    assert main(predict_args(store, out, ckpt, "--min-cover", "-1", "--draws", "2")) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    reader = ShardReader(store)
    assert len(manifest["outputs"]) == reader.valid_s2.sum()
    for name, entry in manifest["outputs"].items():
        assert entry["status"] == "done" and (out / entry["files"]["prediction"]["path"]).is_file()
        assert len(entry["input_dates"]) == 2 and len(set(entry["input_dates"])) == 2, name  # not the target twice
        assert entry["s1"].startswith("present" if entry["time_index"] == WITH_S1 else "missing")
    for location in range(len(reader)):  # the one date with S1: its context is a date without S1
        date = str(reader.date_s2[location, WITH_S1])[:10]
        entry = manifest["outputs"][f"{reader.locations[location]}_{date}"]
        (other,) = [d for d in entry["input_dates"] if d != date]
        assert not reader.valid_s1[location, [str(d)[:10] for d in reader.date_s2[location]].index(other)]


def test_a_done_output_from_other_input_dates_is_made_again(store, tmp_path):
    """An output recorded as made from other input dates (an earlier plan's) is not kept on a rerun."""
    from vcloud.cli import main

    ckpt = tiny_checkpoints(tmp_path / "ckpt")
    out = tmp_path / "out"
    args = predict_args(store, out, ckpt, "--min-cover", "-1", "--draws", "2")
    assert main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    name, entry = next(iter(manifest["outputs"].items()))
    entry["input_dates"] = [entry["date"]] * 2  # as the plan that skipped dates without S1 chose
    (out / "manifest.json").write_text(json.dumps(manifest))
    before = (out / entry["files"]["prediction"]["path"]).stat().st_ino
    assert main(args) == 0
    again = json.loads((out / "manifest.json").read_text())["outputs"][name]
    assert again["input_dates"] != [entry["date"]] * 2
    assert (out / entry["files"]["prediction"]["path"]).stat().st_ino != before  # written again
