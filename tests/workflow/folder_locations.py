"""A folder of your own locations (data.source: folder), written as a user's would be.

The pixels are the synthetic generator's (`vcloud synth`, an extracted tree); each location is
one synthetic ROI rewritten as a plain folder with rasterio: S2/<tile>_YYYYMMDD.tif,
S1/S1_YYYYMMDD.tif taken S1_OFFSET_DAYS after their S2 date on every other date (so the S1
pairing window decides which dates have S1), and SCL/ (Sen2Cor class codes) from the image's
s2cloudless probability: 9 from 0.7, 8 from 0.4, 4 (vegetation) elsewhere. A location of two
patches is two tiles (<location>/<tile>/S2/...): one location, two scenes.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np

from tests.unit.test_folder import _write

S1_OFFSET_DAYS = 4  # every other date's S1: within a window of 4 days or more, outside 3 or less


def scl_codes(s2: np.ndarray) -> np.ndarray:
    """(13, H, W) uint16 -> (1, H, W) uint8 SCL codes from s2cloudless's probability."""
    from vcloud.data.clouds import cloud_probability

    prob = cloud_probability(s2[None], num_threads=1)[0]
    codes = np.full(prob.shape, 4, np.uint8)
    codes[prob >= 0.4] = 8
    codes[prob >= 0.7] = 9
    return codes[None]


def _series(raw: Path, roi, patch: int, size: int) -> list[tuple[dt.date, tuple, tuple]]:
    """(date, (s2, georef), (s1, georef)) of one synthetic patch, in time order."""
    from vcloud.data.geotiff import read_image
    from vcloud.data.layout import parse_name

    folder = raw / roi.rois / str(roi.roi)
    out = []
    for path in sorted((folder / "S2").glob(f"*/s2_*_patch_{patch}.tif"), key=lambda p: int(p.parent.name)):
        name = parse_name(path.name)
        s1_path = next((folder / "S1" / path.parent.name).glob(f"s1_*_patch_{patch}.tif"))
        s2 = read_image(path, bands=13, size=size, dtype=np.uint16)
        s1 = read_image(s1_path, bands=2, size=size, dtype=np.float32)
        out.append((name.date, s2, s1))
    return out


def write_locations(root: Path, plan: dict[str, tuple[int, int]], *, size: int = 32, seed: int = 5) -> Path:
    """root/<name>/... for each name -> (dates, tiles) of `plan`; the synthetic ROIs behind them are
    the default synthetic list's, one per location, `tiles` patches each."""
    from vcloud.data.layout import parse_roi
    from vcloud.data.synthetic import write_raw_tree

    rois = [parse_roi(text) for text in ("ROIs1868/119", "ROIs2017/22", "ROIs1970/119", "ROIs1970/21", "ROIs1868/73")]
    assert len(plan) <= len(rois), "one synthetic ROI per location"
    times = max(dates for dates, _ in plan.values())
    tiles = max(count for _, count in plan.values())
    raw = root.parent / f"{root.name}-synthetic"
    write_raw_tree(raw, rois=rois[: len(plan)], patches=tiles, times=times, size=size, seed=seed)
    for (name, (dates, count)), roi in zip(plan.items(), rois):
        for tile in range(count):
            folder = root / name if count == 1 else root / name / f"tile{tile}"
            for i, (date, (s2, georef), (s1, s1_georef)) in enumerate(_series(raw, roi, tile, size)[:dates]):
                stamp = date.strftime("%Y%m%d")
                _write(folder / "S2" / f"T32TQM_{stamp}.tif", s2, georef)
                _write(folder / "SCL" / f"SCL_{stamp}.tif", scl_codes(s2), georef)
                s1_date = date + dt.timedelta(days=S1_OFFSET_DAYS if i % 2 else 0)
                _write(folder / "S1" / f"S1_{s1_date:%Y%m%d}.tif", s1, s1_georef)
    return root
