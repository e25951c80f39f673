import shutil
from pathlib import Path

import numpy as np
import pytest

from vcloud.data.layout import RoiId
from vcloud.data.prepare import prepare_roi
from vcloud.data.shards import ShardReader, verify
from vcloud.data.store import assemble, normalise_s1, normalise_s2, open_store
from vcloud.errors import BadInputError
from vcloud.io import atomic_output

from ..conftest import TINY


def test_s2_normalisation_matches_the_reference_loader():
    raw = np.array([0, 5000, 10000, 12000], np.uint16)
    np.testing.assert_allclose(normalise_s2(raw), [0.0, 0.5, 1.0, 1.0])
    assert normalise_s2(raw).dtype == np.float32


def test_s1_normalisation_clips_rescales_and_zeroes_nan():
    db = np.array([-30.0, -25.0, -12.5, 0.0, 3.0, np.nan], np.float32)
    np.testing.assert_allclose(normalise_s1(db), [0.0, 0.0, 0.5, 1.0, 1.0, 0.0])


@pytest.fixture(scope="module")
def two_roi_stores(tiny_raw_master, tmp_path_factory):
    folder = tmp_path_factory.mktemp("stores")
    paths = []
    for roi in (RoiId("ROIs1868", 119), RoiId("ROIs1158", 119)):
        out = folder / f"{roi.slug}.zarr"
        prepare_roi(raw=tiny_raw_master, roi=roi, out=out, times=TINY["times"], size=TINY["size"])
        paths.append(out)
    return paths


def test_assemble_concatenates_locations_in_order_and_round_trips(two_roi_stores, tmp_path):
    out = tmp_path / "train.zarr"
    assemble(two_roi_stores, out)
    merged = open_store(out)
    parts = [open_store(p) for p in two_roi_stores]
    assert list(merged["location"].values) == [loc for ds in parts for loc in ds["location"].values]
    assert list(merged["rois"].values) == ["ROIs1868"] * 2 + ["ROIs1158"] * 2
    names = [name for name in merged.variables if "location" in merged[name].dims]
    assert {"s2", "s1", "cloud_prob", "cloud_class", "valid_s2", "date_s2", "transform", "crs"} <= set(names)
    for name in names:
        expected = np.concatenate([ds[name].values for ds in parts])
        np.testing.assert_array_equal(merged[name].values, expected, err_msg=name)
    assert merged.attrs["producer"]["options"]["assembled_from"] == [str(p) for p in two_roi_stores]
    # The loader reads the split as any store: location 2 of the split is location 0 of ROI 2.
    np.testing.assert_array_equal(
        ShardReader(out).read(2, [1, 0]).s2, ShardReader(two_roi_stores[1]).read(0, [1, 0]).s2
    )
    assert verify(out) == []


def _own_bytes(folder, seen):
    total = 0
    for f in folder.rglob("*"):
        st = f.lstat()
        if f.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def test_split_is_one_copy_hard_linked_shards(two_roi_stores, tmp_path):
    out = tmp_path / "train.zarr"
    assemble(two_roi_stores, out)
    roi_shards = {(f.stat().st_ino) for p in two_roi_stores for f in p.glob("s[12]/c/**/*") if f.is_file()}
    split_shards = {f.stat().st_ino for f in out.glob("s[12]/c/**/*") if f.is_file()}
    assert split_shards == roi_shards  # every pixel shard is the per-ROI file itself
    seen: set = set()
    for path in two_roi_stores:
        _own_bytes(path, seen)  # the per-ROI files, counted once
    extra = _own_bytes(out, seen)
    # Only the metadata and the small tables are new: constant, not per pixel.
    assert extra < 64 * 1024, extra
    pixels = sum(f.stat().st_size for p in two_roi_stores for f in p.glob("*/c/**/*") if f.is_file())
    assert extra < pixels  # (at 256 px x 30 dates the ratio is ~1e-4; see the README)


def test_split_survives_moving_the_workflow_and_losing_the_roi_stores(two_roi_stores, tmp_path, monkeypatch):
    work = tmp_path / "work"
    rois = work / "results/prepared/rois"
    rois.mkdir(parents=True)
    copies = [shutil.copytree(p, rois / p.name) for p in two_roi_stores]
    monkeypatch.chdir(work)  # as snakemake runs it: relative paths from the working directory
    assemble([Path("results/prepared/rois") / p.name for p in copies], Path("results/prepared/train.zarr"))
    expected = open_store(work / "results/prepared/train.zarr")["s2"].values
    moved = tmp_path / "elsewhere"
    work.rename(moved)
    shutil.rmtree(moved / "results/prepared/rois")
    split = moved / "results/prepared/train.zarr"
    np.testing.assert_array_equal(open_store(split)["s2"].values, expected)
    assert verify(split) == []


def test_assemble_refuses_duplicates_and_mismatched_sizes(two_roi_stores, tiny_raw_master, tmp_path):
    with pytest.raises(BadInputError, match="location ROIs1868_119_p0 is also in"):
        assemble([two_roi_stores[0], two_roi_stores[0]], tmp_path / "dup.zarr")
    other = tmp_path / "short.zarr"
    prepare_roi(raw=tiny_raw_master, roi=RoiId("ROIs1158", 119), out=other, times=3, size=TINY["size"])
    with pytest.raises(BadInputError, match="time size 3 differs"):
        assemble([two_roi_stores[0], other], tmp_path / "bad.zarr")
    assert not (tmp_path / "dup.zarr").exists() and not (tmp_path / "bad.zarr").exists()


def test_open_store_names_the_problem(tmp_path):
    with pytest.raises(BadInputError, match="prepared store not found"):
        open_store(tmp_path / "nope.zarr")
    (tmp_path / "junk.zarr").mkdir()
    with pytest.raises(BadInputError, match="junk.zarr: not a readable zarr"):
        open_store(tmp_path / "junk.zarr")


def test_atomic_output_removes_the_temporary_on_error(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_output(tmp_path / "x.zarr") as tmp:
            tmp.mkdir()
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_reader_returns_normalised_images_equal_to_xarray(two_roi_stores):
    from vcloud.data.reader import StoreReader

    reader = StoreReader(two_roi_stores[0])
    ds = open_store(two_roi_stores[0])
    sample = reader.read(1, [3, 0, 2])
    np.testing.assert_array_equal(sample.s2, normalise_s2(ds["s2"].values[1, [3, 0, 2]]))
    np.testing.assert_array_equal(sample.s1, normalise_s1(ds["s1"].values[1, [3, 0, 2]]))
    np.testing.assert_allclose(sample.cloud_prob, ds["cloud_prob"].values[1, [3, 0, 2]], atol=1e-6)
    assert sample.s2.shape == (3, 13, TINY["size"], TINY["size"]) and sample.s2.dtype == np.float32
    assert len(reader) == TINY["patches"]
    import pickle

    clone = pickle.loads(pickle.dumps(reader))  # what a DataLoader worker receives
    assert clone._arrays is None
    np.testing.assert_array_equal(clone.read(1, [3]).s2, sample.s2[:1])
