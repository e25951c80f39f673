import numpy as np
import pytest
import tifffile

from vcloud.data.geotiff import BadImageError, GeoRef, read_image, write_image

GEO = GeoRef(32632, (500000.0, 10.0, 0.0, 5000000.0, 0.0, -10.0))


def _s2(seed=0):
    return np.random.default_rng(seed).integers(0, 10000, (13, 16, 16)).astype(np.uint16)


def test_round_trip_keeps_pixels_and_georeferencing(tmp_path):
    data = _s2()
    write_image(tmp_path / "a.tif", data, GEO)
    back, georef = read_image(tmp_path / "a.tif", bands=13, size=16, dtype=np.uint16)
    np.testing.assert_array_equal(back, data)
    assert georef == GEO
    assert georef.crs == "EPSG:32632"


def test_reads_band_interleaved_files_too(tmp_path):
    data = _s2()
    tifffile.imwrite(tmp_path / "c.tif", np.moveaxis(data, 0, -1), planarconfig="contig")
    back, _ = read_image(tmp_path / "c.tif", bands=13, size=16, dtype=np.uint16)
    np.testing.assert_array_equal(back, data)


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.zeros((12, 16, 16), np.uint16), "wrong band count: 12, expected 13"),
        (np.zeros((13, 16, 8), np.uint16), "wrong size: 16x8, expected 16x16"),
        (np.zeros((13, 16, 16), np.float32), "wrong dtype: float32, expected uint16"),
    ],
)
def test_rejects_wrong_shape_and_dtype(tmp_path, array, message):
    write_image(tmp_path / "b.tif", array, GEO)
    with pytest.raises(BadImageError, match=message):
        read_image(tmp_path / "b.tif", bands=13, size=16, dtype=np.uint16)


def test_rejects_non_tiff_and_truncated_files(tmp_path):
    (tmp_path / "n.tif").write_text("not a tiff")
    with pytest.raises(BadImageError, match="not a readable TIFF"):
        read_image(tmp_path / "n.tif", bands=13, size=16, dtype=np.uint16)
    write_image(tmp_path / "a.tif", _s2(), GEO)
    whole = (tmp_path / "a.tif").read_bytes()
    (tmp_path / "t.tif").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(BadImageError, match="not a readable TIFF"):
        read_image(tmp_path / "t.tif", bands=13, size=16, dtype=np.uint16)
