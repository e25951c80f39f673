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


# --- a temporal split: a split store keeps only its dates (DateRanges; data/splits.py) ----------

SPEC = {"val": ["2018-08-01", "2018-09-30"], "test": ["2018-11-01", "2018-12-31"], "gap_days": 20}


def test_date_ranges_mask_keeps_its_ranges_both_ends_included_and_never_a_missing_date():
    from vcloud.data.store import DateRanges

    dates = np.array(
        ["2018-01-31", "2018-02-01", "2018-02-28", "2018-03-01", "2018-06-15", "NaT", "2018-12-31T12:00"],
        "datetime64[ns]",
    )
    assert DateRanges().mask(dates).tolist() == [True] * 5 + [False, True]  # every date but NaT
    keep = DateRanges(keep=(("2018-02-01", "2018-02-28"), ("2018-12-31", "2018-12-31")))
    assert keep.mask(dates).tolist() == [False, True, True, False, False, False, True]
    drop = DateRanges(drop=(("2018-02-01", "2018-03-01"),))
    assert drop.mask(dates).tolist() == [True, False, False, False, True, False, True]
    both = DateRanges(keep=(("2018-01-01", "2018-06-30"),), drop=(("2018-02-15", "2018-03-01"),))
    assert both.mask(dates.reshape(1, -1)).tolist() == [[True, True, False, False, True, False, False]]
    assert both.describe() == "2018-01-01..2018-06-30 but 2018-02-15..2018-03-01"
    assert drop.describe() == "every date but 2018-02-01..2018-03-01"
    assert both.flags() == "--keep 2018-01-01 2018-06-30 --drop 2018-02-15 2018-03-01"
    assert both.as_attrs() == {"keep": [["2018-01-01", "2018-06-30"]], "drop": [["2018-02-15", "2018-03-01"]]}


@pytest.fixture(scope="module")
def year_store(tmp_path_factory):
    """One ROI of 2 locations x 12 dates over 2018 (the synthetic generator's dates, about monthly)."""
    from vcloud.data.synthetic import write_raw_tree

    folder = tmp_path_factory.mktemp("year")
    roi = RoiId("ROIs1868", 119)
    write_raw_tree(folder / "raw", rois=[roi], patches=2, times=12, size=TINY["size"], seed=3)
    out = folder / f"{roi.slug}.zarr"
    prepare_roi(raw=folder / "raw", roi=roi, out=out, times=12, size=TINY["size"])
    return out


@pytest.fixture(scope="module")
def temporal_stores(year_store, tmp_path_factory):
    """train, val and test of SPEC assembled from the one store, as rule assemble_split does."""
    from vcloud.data.splits import temporal_ranges

    folder = tmp_path_factory.mktemp("temporal")
    stores = {}
    for split, ranges in temporal_ranges(SPEC).items():
        stores[split] = folder / f"{split}.zarr"
        assemble([year_store], stores[split], dates=ranges)
    return stores


def _days(store) -> np.ndarray:
    return open_store(store)["date_s2"].values.astype("datetime64[D]")


def _in(days, first, last) -> np.ndarray:
    return (days >= np.datetime64(first)) & (days <= np.datetime64(last))


def test_each_split_store_keeps_only_its_dates(year_store, temporal_stores):
    whole = open_store(year_store)
    days = _days(year_store)
    gap = np.timedelta64(SPEC["gap_days"], "D")
    near = {
        name: _in(days, np.datetime64(first) - gap, np.datetime64(last) + gap)
        for name, (first, last) in (("val", SPEC["val"]), ("test", SPEC["test"]))
    }
    expected = {"train": ~near["val"] & ~near["test"], "val": _in(days, *SPEC["val"]), "test": _in(days, *SPEC["test"])}
    assert expected["train"].sum() >= 2 * 4 and expected["val"].sum() >= 2 * 2 and expected["test"].sum() >= 2 * 2
    for split, store in temporal_stores.items():
        ds = open_store(store)
        kept = expected[split]
        np.testing.assert_array_equal(ds["valid_s2"].values, whole["valid_s2"].values & kept, err_msg=split)
        np.testing.assert_array_equal(ds["valid_s1"].values, whole["valid_s1"].values & kept, err_msg=split)
        assert np.isnan(ds["cloud_cover"].values[~kept]).all()
        np.testing.assert_array_equal(ds["cloud_cover"].values[kept], whole["cloud_cover"].values[kept])
        assert (ds["cloud_class"].values[~kept] == -1).all() and ds["cloud_class"].dtype == np.int8
        np.testing.assert_array_equal(ds["date_s2"].values, whole["date_s2"].values)  # the dates stay
        assert ds.attrs["counts"]["missing_s2"] == int((~kept).sum())
        assert ds.attrs["date_ranges"]["keep"] == ([list(SPEC[split])] if split != "train" else [])
        # the pixels are the per-ROI store's own files, whatever the split keeps
        shards = {f.stat().st_ino for f in store.glob("s2/c/**/*") if f.is_file()}
        assert shards == {f.stat().st_ino for f in year_store.glob("s2/c/**/*") if f.is_file()}
        assert verify(store) == []
    # no date in two splits, and none of training's within the gap of val or test
    kept = {split: open_store(store)["valid_s2"].values for split, store in temporal_stores.items()}
    assert not (kept["train"] & kept["val"]).any() and not (kept["val"] & kept["test"]).any()
    assert not (kept["train"] & (near["val"] | near["test"])).any()


def test_samplers_of_a_split_store_only_ever_pick_its_dates(temporal_stores):
    """Training and evaluation read the split stores: every date a sampler shows of val is in val's
    range (the target and every input), and of train never within the gap of val or test."""
    from vcloud.data.samples import CloudySamples
    from vcloud.evaluation.protocols import ReferenceSamples

    val_days = _days(temporal_stores["val"])
    cloudy = CloudySamples(temporal_stores["val"], dates=3, seed=0, clear_max_cover=0.05)
    seen = set()
    for index in range(40):
        location, target, dates, slot, _ = cloudy.pick(index)
        assert dates[slot] == target
        for t in [target, *dates]:
            assert _in(val_days[location, t], *SPEC["val"]), (index, location, t, val_days[location, t])
            seen.add((location, t))
    assert cloudy[0]["x"].shape[0] == 3
    reference = ReferenceSamples(temporal_stores["val"], dates=2, truths=None)
    assert len(reference) > 0
    for location, truth, inputs, _, _ in reference.items:
        for t in [truth, *inputs]:
            assert _in(val_days[location, t], *SPEC["val"]), (location, t)

    train_days = _days(temporal_stores["train"])
    gap = np.timedelta64(SPEC["gap_days"], "D")
    cloudy = CloudySamples(temporal_stores["train"], dates=3, seed=0, clear_max_cover=0.05)
    for index in range(40):
        location, target, dates, _, _ = cloudy.pick(index)
        for t in [target, *dates]:
            day = train_days[location, t]
            for first, last in (SPEC["val"], SPEC["test"]):
                assert not _in(day, np.datetime64(first) - gap, np.datetime64(last) + gap), (index, day)


def test_a_split_whose_ranges_hold_no_date_is_one_line_and_nothing_written(year_store, tmp_path):
    from vcloud.data.store import DateRanges

    out = tmp_path / "val.zarr"
    with pytest.raises(BadInputError) as err:
        assemble([year_store], out, dates=DateRanges(keep=(("2017-01-01", "2017-12-31"),)))
    assert str(err.value) == f"{out}: no S2 date of {year_store} is among the kept (2017-01-01..2017-12-31)"
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--keep", "2018-13-01", "2018-12-01"], "--keep 2018-13-01 2018-12-01: 2018-13-01 is not a date YYYY-MM-DD"),
        (["--drop", "2018-02-01", "2018-02-30"], "--drop 2018-02-01 2018-02-30: 2018-02-30 is not a date YYYY-MM-DD"),
        (["--keep", "20180101", "2018-03-01"], "--keep 20180101 2018-03-01: 20180101 is not a date YYYY-MM-DD"),
        (
            ["--keep", "2018-12-01", "2018-11-01"],
            "--keep 2018-12-01 2018-11-01: 2018-12-01 is after 2018-11-01 (give FIRST LAST)",
        ),
    ],
)
def test_vcloud_assemble_refuses_a_malformed_date_in_one_line(year_store, tmp_path, capsys, flags, message):
    from vcloud.cli import main

    out = tmp_path / "val.zarr"
    assert main(["assemble", "--out", str(out), *flags, str(year_store)]) == 2
    assert capsys.readouterr().err == f"vcloud assemble: error: {message}\n"
    assert not out.exists()


def test_vcloud_assemble_keeps_the_dates_its_flags_name(year_store, temporal_stores, tmp_path):
    from vcloud.cli import main

    out = tmp_path / "train.zarr"
    flags = ["--drop", "2018-07-12", "2018-10-20", "--drop", "2018-10-12", "2019-01-20"]
    assert main(["assemble", "--out", str(out), *flags, str(year_store)]) == 0
    ds = open_store(out)
    assert ds.attrs["date_ranges"] == {"keep": [], "drop": [["2018-07-12", "2018-10-20"], ["2018-10-12", "2019-01-20"]]}
    np.testing.assert_array_equal(ds["valid_s2"].values, open_store(temporal_stores["train"])["valid_s2"].values)
