"""The synthetic raw tree: real layout, real dtypes, determinism, ground truth, wind, detector agreement."""

import csv
import datetime as dt
import filecmp
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from vcloud.cli import main
from vcloud.constants import CLOUD_CLASSES, S2_BANDS
from vcloud.data import synthetic
from vcloud.data.geotiff import read_image
from vcloud.data.layout import RoiId, parse_name
from vcloud.data.synthetic import ADVECTION_S, PIXEL_M, default_rois, write_raw_tree

SMALL = {"patches": 2, "times": 6, "size": 32, "seed": 5}
SMALL_ROIS = [RoiId("ROIs1868", 119), RoiId("ROIs1158", 119)]
# Official lists of the reference loader (UnCRtainTS, region "all").
OFFICIAL_TEST = {
    "ROIs1868/119",
    "ROIs1970/139",
    "ROIs2017/108",
    "ROIs2017/63",
    "ROIs1158/106",
    "ROIs1868/73",
    "ROIs2017/32",
    "ROIs1868/100",
    "ROIs1970/132",
    "ROIs2017/103",
    "ROIs1868/142",
    "ROIs1970/20",
    "ROIs2017/140",
}
OFFICIAL_VAL = {"ROIs2017/22", "ROIs1970/65", "ROIs2017/117", "ROIs1868/127", "ROIs1868/17"}
B = {name: i for i, name in enumerate(S2_BANDS)}


MEDIUM = {"patches": 3, "times": 8, "size": 64, "seed": 11}  # the default config's patch size


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synth") / "raw"
    write_raw_tree(root, rois=SMALL_ROIS, **SMALL)
    return root


@pytest.fixture(scope="module")
def medium(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synth") / "medium"
    write_raw_tree(root, rois=default_rois(2), **MEDIUM)
    return root


def _read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames), list(reader)


def _images(root: Path) -> dict[tuple, Path]:
    """(kind, rois, roi, patch, t) -> path of every tif in the tree."""
    return {
        (n.kind, n.rois, n.roi, n.patch, n.t): path
        for path in sorted(root.rglob("*.tif"))
        for n in [parse_name(path.name)]
    }


def _s2(root: Path, row: dict, size: int) -> np.ndarray:
    (path,) = (root / row["rois"] / row["roi"] / "S2" / row["t"]).glob(f"*_patch_{row['patch']}.tif")
    return read_image(path, bands=13, size=size, dtype=np.uint16)[0].astype(np.float32)


# ----------------------------------------------------------------------------- layout and files


def test_every_file_parses_and_lies_where_its_name_says(small):
    paths = sorted(small.rglob("*.tif"))
    assert len(paths) == len(SMALL_ROIS) * SMALL["patches"] * SMALL["times"] * 2
    seen = set()
    for path in paths:
        name = parse_name(path.name)
        assert name.path(small) == path
        assert name.date.year == 2018
        seen.add((name.kind, name.rois, name.roi, name.patch, name.t))
    expected = {
        (kind, roi.rois, roi.roi, patch, t)
        for kind in ("s1", "s2")
        for roi in SMALL_ROIS
        for patch in range(SMALL["patches"])
        for t in range(SMALL["times"])
    }
    assert seen == expected
    assert sorted(p.name for p in small.iterdir()) == ["ROIs1158", "ROIs1868", "truth.csv", "wind.csv"]


def test_dates_spread_over_the_year_and_s1_stays_within_days_of_s2(small):
    dates = defaultdict(dict)  # (rois, roi, t) -> {kind: {dates of all patches}}
    for (kind, rois, roi, _, t), path in _images(small).items():
        dates[(rois, roi, t)].setdefault(kind, set()).add(parse_name(path.name).date)
    shifts, per_roi = [], []
    for roi in SMALL_ROIS:
        s2 = []
        for t in range(SMALL["times"]):
            pair = dates[(roi.rois, roi.roi, t)]
            assert len(pair["s2"]) == len(pair["s1"]) == 1  # one date per (ROI, t) for all patches
            s2.append(next(iter(pair["s2"])))
            shifts.append((next(iter(pair["s1"])) - s2[-1]).days)
        assert all(b > a for a, b in zip(s2, s2[1:]))
        assert (s2[-1] - s2[0]).days > 365 * (SMALL["times"] - 2) / SMALL["times"]
        per_roi.append(s2)
    assert max(abs(s) for s in shifts) <= synthetic.S1_MAX_DATE_SHIFT_DAYS
    assert any(shifts)  # some S1 images are not taken on their S2 date
    assert per_roi[0] != per_roi[1]  # each ROI has its own dates


def test_images_have_raw_dtypes_bands_size_and_side_by_side_georeferencing(small):
    size = SMALL["size"]
    nan_images = 0
    for (kind, _rois, _roi, patch, _t), path in _images(small).items():
        if kind == "s2":
            data, georef = read_image(path, bands=13, size=size, dtype=np.uint16)
            assert data.max() > 0
        else:
            data, georef = read_image(path, bands=2, size=size, dtype=np.float32)
            nans = int(np.isnan(data).sum())
            nan_images += nans > 0
            assert nans < 0.1 * data.size  # a few, never most
            assert not np.isinf(data).any()
        assert 32601 <= georef.epsg <= 32660
        x0, pixel_w, _, y0, _, pixel_h = georef.transform
        assert (pixel_w, pixel_h) == (10.0, -10.0)
        if patch > 0:
            _, left = read_image(
                next((path.parent).glob(f"*_patch_{patch - 1}.tif")), bands=data.shape[0], size=size, dtype=data.dtype
            )
            assert left.epsg == georef.epsg
            assert (left.transform[0] + size * 10.0, left.transform[3]) == (x0, y0)
    assert nan_images >= 1


def test_content_is_plausible_per_class(medium):
    size = MEDIUM["size"]
    _, truth = _read_csv(medium / "truth.csv")
    by_class, clear_s1 = defaultdict(list), []
    for row in truth:
        by_class[row["cloud_class"]].append(_s2(medium, row, size))
        if row["cloud_class"] == "clear":
            (path,) = (medium / row["rois"] / row["roi"] / "S1" / row["t"]).glob(f"*_patch_{row['patch']}.tif")
            clear_s1.append(read_image(path, bands=2, size=size, dtype=np.float32)[0])
    clear = np.stack(by_class["clear"])  # (N, 13, H, W)
    ndvi = (clear[:, B["B8"]] - clear[:, B["B4"]]) / (clear[:, B["B8"]] + clear[:, B["B4"]])
    green = ndvi > 0.4
    assert green.mean() > 0.05
    assert np.median(clear[:, B["B8"]][green]) > 2000  # vegetation: bright NIR
    assert np.median(clear[:, B["B7"]][green] - clear[:, B["B5"]][green]) > 500  # red edge rise
    assert np.median(clear[:, B["B10"]]) < 100  # no cirrus signal on clear days
    assert ((clear[:, B["B8"]] < 800) & (clear[:, B["B2"]] > clear[:, B["B8"]])).any()  # some water
    thin = np.stack(by_class["thin"])
    assert np.percentile(thin[:, B["B10"]], 95) > 250  # the cirrus band sees the haze
    opaque = np.stack(by_class["opaque"])
    assert opaque[:, B["B2"]].mean() > 3500 and opaque[:, B["B2"]].min() > 2000
    s1 = np.stack([read_image(p, bands=2, size=size, dtype=np.float32)[0] for p in medium.rglob("s1_*.tif")])
    assert np.nanmedian(s1[:, 0] - s1[:, 1]) > 4  # VV above VH
    assert -35 < np.nanpercentile(s1, 1) and np.nanpercentile(s1, 99) < 5
    water, vv = clear[:, B["B8"]] < 800, np.stack(clear_s1)[:, 0]  # water is dark in S1 too
    assert np.nanmedian(vv[water]) < np.nanmedian(vv[~water]) - 5


def test_vegetation_follows_the_seasons(tmp_path):
    root, size = tmp_path / "raw", 32
    write_raw_tree(root, rois=[RoiId("ROIs1970", 22)], patches=1, times=12, size=size, seed=4)
    _, truth = _read_csv(root / "truth.csv")
    greenest = []  # NDVI of the greenest pixels on each clear date
    for row in truth:
        if row["cloud_class"] == "clear":
            s2 = _s2(root, row, size)
            greenest.append(np.percentile((s2[B["B8"]] - s2[B["B4"]]) / (s2[B["B8"]] + s2[B["B4"]]), 90))
    assert len(greenest) >= 4
    assert max(greenest) - min(greenest) > 0.1


# ----------------------------------------------------------------------------- determinism


def test_same_seed_writes_identical_bytes_and_another_seed_differs(small, tmp_path):
    again = tmp_path / "again"
    write_raw_tree(again, rois=SMALL_ROIS, **SMALL)
    files = sorted(p.relative_to(small) for p in small.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    _, mismatch, errors = filecmp.cmpfiles(small, again, [str(f) for f in files], shallow=False)
    assert mismatch == [] and errors == []

    other = tmp_path / "other"
    write_raw_tree(other, rois=SMALL_ROIS, **{**SMALL, "seed": SMALL["seed"] + 1})
    s2_small = sorted(small.rglob("s2_*.tif"))
    s2_other = sorted(other.rglob("s2_*.tif"))
    differing = sum(a.read_bytes() != b.read_bytes() for a, b in zip(s2_small, s2_other))
    assert differing == len(s2_small)
    assert (small / "wind.csv").read_bytes() != (other / "wind.csv").read_bytes()


def test_a_roi_does_not_depend_on_the_other_rois_listed(small, tmp_path):
    alone = tmp_path / "alone"
    write_raw_tree(alone, rois=SMALL_ROIS[1:], **SMALL)
    for path in sorted((alone / "ROIs1158").rglob("*.tif")):
        assert path.read_bytes() == (small / path.relative_to(alone)).read_bytes()


# ----------------------------------------------------------------------------- wind and truth


def test_wind_csv_has_one_row_per_roi_and_date_with_the_s2_dates(small):
    header, rows = _read_csv(small / "wind.csv")
    assert header == ["rois", "roi", "date", "u", "v"]
    assert len(rows) == len(SMALL_ROIS) * SMALL["times"]
    images = _images(small)
    for i, row in enumerate(rows):
        roi, t = SMALL_ROIS[i // SMALL["times"]], i % SMALL["times"]
        assert (row["rois"], int(row["roi"])) == (roi.rois, roi.roi)
        s2_date = parse_name(images[("s2", roi.rois, roi.roi, 0, t)].name).date
        assert dt.date.fromisoformat(row["date"]) == s2_date
        assert 0.5 < np.hypot(float(row["u"]), float(row["v"])) < 30


def test_truth_csv_has_one_row_per_image_with_class_and_cover(small):
    header, rows = _read_csv(small / "truth.csv")
    assert header == ["rois", "roi", "patch", "t", "cloud_class", "cloud_cover"]
    keys = [(r["rois"], int(r["roi"]), int(r["patch"]), int(r["t"])) for r in rows]
    assert sorted(keys) == sorted({k[1:] for k in _images(small)})
    assert len(set(keys)) == len(keys)
    for row in rows:
        cover = float(row["cloud_cover"])
        assert row["cloud_class"] in CLOUD_CLASSES
        if row["cloud_class"] == "clear":
            assert cover == 0.0
        elif row["cloud_class"] == "opaque":
            assert cover == 1.0
        elif row["cloud_class"] == "thick":
            assert 0.2 < cover < 1.0
        else:
            assert cover > 0.3


def test_last_patch_is_never_clear_and_the_others_have_several_clear_dates(small):
    _, rows = _read_csv(small / "truth.csv")
    clear = Counter((r["rois"], r["roi"], int(r["patch"])) for r in rows if r["cloud_class"] == "clear")
    for roi in SMALL_ROIS:
        assert clear[(roi.rois, str(roi.roi), SMALL["patches"] - 1)] == 0
        for patch in range(SMALL["patches"] - 1):
            assert clear[(roi.rois, str(roi.roi), patch)] >= 2


def test_every_cloud_class_appears_in_a_small_tree(small):
    _, rows = _read_csv(small / "truth.csv")
    assert {r["cloud_class"] for r in rows} == set(CLOUD_CLASSES)
    for roi in SMALL_ROIS:  # and in every ROI
        in_roi = {r["cloud_class"] for r in rows if (r["rois"], int(r["roi"])) == (roi.rois, roi.roi)}
        assert in_roi == set(CLOUD_CLASSES)


def test_clouds_drift_by_the_wind_in_wind_csv(tmp_path):
    """Two opaque images of one location: the cloud texture of the later one is the earlier one
    moved by the sum of wind * ADVECTION_S between them (east = +col, north = -row)."""
    size, times, roi = 64, 20, RoiId("ROIs1970", 22)
    root = tmp_path / "raw"
    write_raw_tree(root, rois=[roi], patches=2, times=times, size=size, seed=2)
    _, wind = _read_csv(root / "wind.csv")
    uv = np.array([[float(w["u"]), float(w["v"])] for w in wind])
    # Position of the cloud field per date, rounded to pixels as the generator samples it.
    drift = np.round(np.cumsum(uv * ADVECTION_S / PIXEL_M, axis=0))  # (T, 2) east, north
    _, truth = _read_csv(root / "truth.csv")
    opaque = [r for r in truth if r["cloud_class"] == "opaque" and r["patch"] == "1"]
    pairs = [(a, b) for i, a in enumerate(opaque) for b in opaque[i + 1 :]]
    shift = {}
    for a, b in pairs:
        east, north = drift[int(b["t"])] - drift[int(a["t"])]
        shift[(a["t"], b["t"])] = (int(-north), int(east))  # (rows, cols) the texture moves
    (a, b), (dr, dc) = min(zip(pairs, shift.values()), key=lambda item: max(map(abs, item[1])))
    assert max(abs(dr), abs(dc)) <= 20, "the seed gives no opaque pair close enough in time"
    assert (dr, dc) != (0, 0)
    first, second = _s2(root, a, size)[B["B2"]], _s2(root, b, size)[B["B2"]]

    def match(r: int, c: int) -> float:  # correlation of second[y, x] with first[y - r, x - c]
        later = second[max(r, 0) : size + min(r, 0), max(c, 0) : size + min(c, 0)]
        earlier = first[max(-r, 0) : size + min(-r, 0), max(-c, 0) : size + min(-c, 0)]
        return float(np.corrcoef(later.ravel(), earlier.ravel())[0, 1])

    scores = {(r, c): match(r, c) for r in range(-24, 25) for c in range(-24, 25)}
    assert max(scores, key=scores.get) == (dr, dc)
    assert scores[(dr, dc)] > 0.9 > scores[(0, 0)]


# ----------------------------------------------------------------------------- detector agreement


def test_s2cloudless_finds_the_true_class_for_most_images(medium):
    from vcloud.data.clouds import CloudThresholds, cloud_cover_and_class, cloud_mask, cloud_probability

    _, rows = _read_csv(medium / "truth.csv")
    s2 = np.stack([_s2(medium, row, MEDIUM["size"]) for row in rows]).astype(np.uint16)
    prob = cloud_probability(s2)
    _, detected = cloud_cover_and_class(prob, cloud_mask(prob), CloudThresholds())
    confusion = np.zeros((4, 4), int)  # truth x detected
    for row, found in zip(rows, detected):
        confusion[CLOUD_CLASSES.index(row["cloud_class"]), found] += 1
    rate = confusion / confusion.sum(axis=1, keepdims=True)
    clear, thin, thick, opaque = range(4)
    # Measured over seeds 0..5 of this tree: thick 0.93..1.0, every other rate 1.0.
    assert rate[clear, clear] >= 0.9, confusion
    assert rate[opaque, opaque] >= 0.9, confusion
    assert rate[thick, thick] + rate[thick, opaque] >= 0.8, confusion
    assert rate[thin, thin] >= 0.8, confusion
    assert np.trace(confusion) / confusion.sum() >= 0.9, confusion


# ----------------------------------------------------------------------------- names and arguments


def test_default_rois_cover_test_val_and_train_with_a_repeated_roi_number():
    four = default_rois(4)
    assert four == [RoiId("ROIs1868", 119), RoiId("ROIs2017", 22), RoiId("ROIs1970", 119), RoiId("ROIs1970", 21)]
    names = [str(roi) for roi in four]
    assert sum(n in OFFICIAL_TEST for n in names) == 1 and sum(n in OFFICIAL_VAL for n in names) == 1
    assert sum(n not in OFFICIAL_TEST | OFFICIAL_VAL for n in names) == 2
    numbers = Counter(roi.roi for roi in four)
    assert any(count > 1 and len({r.rois for r in four if r.roi == n}) > 1 for n, count in numbers.items())
    many = default_rois(30)
    assert len(set(many)) == 30 and many[:4] == four and default_rois(30) == many
    assert all(str(roi) not in OFFICIAL_TEST | OFFICIAL_VAL for roi in many[2:])
    assert default_rois(1) == four[:1]


@pytest.mark.parametrize("n", [0, -1, 2.5, True])
def test_default_rois_rejects_a_bad_count(n):
    with pytest.raises(ValueError, match="rois"):
        default_rois(n)


@pytest.mark.parametrize(
    "change, word",
    [
        ({"patches": 0}, "patches"),
        ({"times": 0}, "times"),
        ({"times": 366}, "times"),
        ({"size": -4}, "size"),
        ({"size": 8.0}, "size"),
        ({"seed": -1}, "seed"),
        ({"rois": []}, "rois"),
        ({"rois": [RoiId("ROIs1868", 119)] * 2}, "rois"),
        ({"rois": ["ROIs1868/119"]}, "rois"),
    ],
)
def test_bad_arguments_raise_naming_the_argument_and_write_nothing(tmp_path, change, word):
    args = {"rois": SMALL_ROIS, **SMALL, **change}
    with pytest.raises(ValueError, match=word):
        write_raw_tree(tmp_path / "raw", **args)
    assert list(tmp_path.iterdir()) == []


def test_cli_reports_a_bad_argument_in_one_line(tmp_path, capsys):
    assert main(["synth", "--out", str(tmp_path / "raw"), "--patches", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "patches" in err
    assert not (tmp_path / "raw").exists()


def test_cli_writes_the_tree(tmp_path):
    out = tmp_path / "raw"
    assert main(["synth", "--out", str(out), "--rois", "1", "--patches", "1", "--times", "3", "--size", "16"]) == 0
    assert len(list(out.rglob("*.tif"))) == 6 and (out / "ROIs1868" / "119").is_dir()


def test_a_foreign_folder_is_never_replaced(tmp_path):
    out = tmp_path / "raw"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not an empty folder"):
        write_raw_tree(out, rois=SMALL_ROIS, **SMALL)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_an_earlier_tree_is_replaced_whole(small, tmp_path):
    out = tmp_path / "raw"
    write_raw_tree(out, rois=SMALL_ROIS, **{**SMALL, "times": 7})
    write_raw_tree(out, rois=SMALL_ROIS, **SMALL)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == sorted(p.relative_to(small) for p in small.rglob("*"))


def test_a_failure_midway_leaves_no_partial_tree(tmp_path, monkeypatch):
    calls = []

    def failing_write(path, data, georef):
        calls.append(path)
        if len(calls) == 10:
            raise OSError("disk full")

    monkeypatch.setattr(synthetic, "write_image", failing_write)
    with pytest.raises(OSError, match="disk full"):
        write_raw_tree(tmp_path / "raw", rois=SMALL_ROIS, **SMALL)
    assert list(tmp_path.iterdir()) == []
