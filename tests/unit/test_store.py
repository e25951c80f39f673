import numpy as np
import pytest

from vcloud.data.layout import RoiId
from vcloud.data.prepare import prepare_roi
from vcloud.data.store import assemble, atomic_output, normalise_s1, normalise_s2, open_store
from vcloud.errors import BadInputError

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
    for name in ("s2", "s1", "cloud_prob", "cloud_class", "valid_s2", "date_s2", "transform", "crs"):
        expected = np.concatenate([ds[name].values for ds in parts])
        np.testing.assert_array_equal(merged[name].values, expected, err_msg=name)
    assert merged.attrs["producer"]["options"]["assembled_from"] == [str(p) for p in two_roi_stores]


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
