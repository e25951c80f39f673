import datetime as dt
import random
from pathlib import Path

import pytest

from vcloud.data.layout import RawName, RoiId, discover_rois, parse_name, parse_roi, scan_roi
from vcloud.errors import BadInputError

from ..conftest import TINY


def test_parse_name_reads_every_field():
    name = parse_name("s2_ROIs1868_119_ImgNo_7_2018-03-11_patch_42.tif")
    assert name == RawName("s2", "ROIs1868", 119, 7, dt.date(2018, 3, 11), 42)
    assert name.filename == "s2_ROIs1868_119_ImgNo_7_2018-03-11_patch_42.tif"
    assert name.path(Path("/r")) == Path("/r/ROIs1868/119/S2/7/" + name.filename)


@pytest.mark.parametrize(
    "bad",
    [
        "s2_ROIs1868_119_ImgNo_7_2018-03-11.tif",  # no patch
        "s3_ROIs1868_119_ImgNo_7_2018-03-11_patch_1.tif",  # unknown kind
        "s2_ROIs1868_119_ImgNo_7_2018-03-11_patch_1.tiff",  # extension
        "s2_ROI1868_119_ImgNo_7_2018-03-11_patch_1.tif",  # folder name
        "s2_ROIs1868_119_ImgNo_x_2018-03-11_patch_1.tif",  # time index
    ],
)
def test_parse_name_rejects_malformed_names(bad):
    with pytest.raises(ValueError, match="does not parse"):
        parse_name(bad)


def test_parse_name_rejects_impossible_date():
    with pytest.raises(ValueError, match="not a calendar date"):
        parse_name("s1_ROIs1868_119_ImgNo_7_2018-02-30_patch_1.tif")


def test_parse_roi_accepts_slash_and_slug_forms():
    assert parse_roi("ROIs2017/22") == RoiId("ROIs2017", 22) == parse_roi("ROIs2017_22")
    assert RoiId("ROIs2017", 22).slug == "ROIs2017_22"
    with pytest.raises(BadInputError, match="ROIsXXXX/NNN"):
        parse_roi("2017/22")


def test_discover_rois_keeps_repeated_roi_numbers_apart(tiny_raw):
    assert discover_rois(tiny_raw) == [RoiId("ROIs1158", 119), RoiId("ROIs1868", 119)]


def test_scan_pairs_every_image_by_patch_and_time(tiny_raw):
    scan = scan_roi(tiny_raw, RoiId("ROIs1868", 119), times=TINY["times"])
    assert scan.problems == []
    assert scan.patches == list(range(TINY["patches"]))
    assert len(scan.images) == TINY["patches"] * TINY["times"]
    for (patch, t), pair in scan.images.items():
        assert set(pair) == {"s1", "s2"}
        assert pair["s1"].patch == pair["s2"].patch == patch
        assert pair["s1"].t == pair["s2"].t == t


def test_pairing_ignores_listing_order(tiny_raw, monkeypatch):
    roi = RoiId("ROIs1868", 119)
    reference = scan_roi(tiny_raw, roi, times=TINY["times"]).images
    original = Path.iterdir
    rng = random.Random(0)

    def shuffled(self):
        items = list(original(self))
        rng.shuffle(items)
        return iter(items)

    monkeypatch.setattr(Path, "iterdir", shuffled)
    # Also rename so that S1 and S2 patch ids sort differently as text (patch_10 < patch_2).
    for kind in ("S1", "S2"):
        for path in (tiny_raw / "ROIs1868/119" / kind).glob("*/*_patch_1.tif"):
            path.rename(path.with_name(path.name.replace("_patch_1.tif", "_patch_10.tif")))
    images = scan_roi(tiny_raw, roi, times=TINY["times"]).images
    assert {(p if p != 1 else 10, t) for p, t in reference} == set(images)
    for (patch, _t), pair in images.items():
        assert pair["s1"].patch == pair["s2"].patch == patch


def test_scan_reports_missing_time_folder_once(tiny_raw):
    import shutil

    shutil.rmtree(tiny_raw / "ROIs1868/119/S2/2")
    scan = scan_roi(tiny_raw, RoiId("ROIs1868", 119), times=TINY["times"])
    assert [(p.reason, p.kind, p.t) for p in scan.problems] == [("missing time folder", "s2", 2)]


def test_scan_reports_partner_missing_and_bad_names(tiny_raw):
    s2 = next((tiny_raw / "ROIs1868/119/S2/1").glob("*_patch_0.tif"))
    s2.unlink()
    (tiny_raw / "ROIs1868/119/S1/0/notes.txt").write_text("x")
    scan = scan_roi(tiny_raw, RoiId("ROIs1868", 119), times=TINY["times"])
    reasons = {p.reason.split(" ")[0] + " " + p.reason.split(" ")[1] for p in scan.problems}
    assert "S2 partner" in reasons
    assert "file name" in reasons
    partner = next(p for p in scan.problems if "partner" in p.reason)
    assert (partner.kind, partner.patch, partner.t) == ("s2", 0, 1)


def test_scan_keeps_s2_without_s1_and_absent_dates_as_data(tiny_raw):
    import shutil

    next((tiny_raw / "ROIs1868/119/S1/1").glob("*_patch_0.tif")).unlink()
    for kind in ("S1", "S2"):
        shutil.rmtree(tiny_raw / f"ROIs1868/119/{kind}/3")
    scan = scan_roi(tiny_raw, RoiId("ROIs1868", 119), times=TINY["times"] + 1)
    assert scan.problems == []
    assert scan.s1_missing == [(0, 1)] and scan.absent == [3, 4] and scan.beyond == []


def test_scan_reports_a_file_in_the_wrong_folder(tiny_raw):
    src = next((tiny_raw / "ROIs1868/119/S2/1").glob("*_patch_0.tif"))
    src.rename(tiny_raw / "ROIs1868/119/S2/3" / src.name)
    scan = scan_roi(tiny_raw, RoiId("ROIs1868", 119), times=TINY["times"])
    assert any("lies in S2/3" in p.reason for p in scan.problems)


def test_empty_roi_is_an_error(tmp_path):
    (tmp_path / "ROIs1868/5/S1/0").mkdir(parents=True)
    with pytest.raises(BadInputError, match="empty ROI"):
        scan_roi(tmp_path, RoiId("ROIs1868", 5), times=1)
    with pytest.raises(BadInputError, match="ROI folder not found"):
        scan_roi(tmp_path, RoiId("ROIs1868", 6), times=1)
