"""Scenes of any size as a user's plain folder: real GeoTIFFs written by rasterio, synthetic pixels.

A smooth field (two sinusoids, 13 bands at slightly different gains) on a UTM grid, one date
darker or brighter than the next, and on `cloudy` dates a bright disc (a cloud) in the middle.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

DATES = ("20190301", "20190311", "20190321")
ORIGIN = (500000.0, 5000000.0)  # EPSG:32633, 10 m pixels


def write_scene(root: Path, height: int, width: int, *, dates=DATES, cloudy=(1,), origin=ORIGIN) -> Path:
    """root/S2/T33_<date>.tif (13 bands uint16) and root/S1/S1_<date>.tif (VV, VH float32)."""
    import rasterio
    from rasterio.transform import from_origin

    (root / "S2").mkdir(parents=True, exist_ok=True)
    (root / "S1").mkdir(exist_ok=True)
    transform = from_origin(*origin, 10, 10)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = 1500 + 500 * np.sin(yy / 37.0) + 400 * np.cos(xx / 23.0)
    common = {"driver": "GTiff", "height": height, "width": width, "crs": "EPSG:32633", "transform": transform}
    for i, date in enumerate(dates):
        s2 = np.stack([base * (0.8 + 0.03 * b) + 50 * i for b in range(13)]).astype(np.uint16)
        if i in cloudy:
            s2[:, (yy - height / 2) ** 2 + (xx - width / 2) ** 2 < (min(height, width) / 4) ** 2] = 6000
        with rasterio.open(root / "S2" / f"T33_{date}.tif", "w", count=13, dtype="uint16", **common) as dst:
            dst.write(s2)
        s1 = np.stack([np.full_like(base, -10.0), np.full_like(base, -17.0)])
        with rasterio.open(root / "S1" / f"S1_{date}.tif", "w", count=2, dtype="float32", **common) as dst:
            dst.write(s1)
    return root


def prepare_args(raw: Path, out: Path, *extra: str) -> list[str]:
    return ["prepare", "--raw", str(raw), "--roi", "ROIs9000/1", "--out", str(out), "--size", "32", *extra]
