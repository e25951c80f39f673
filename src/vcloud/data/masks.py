"""Cloud masks that come with the data: Sentinel-2 scene classification (SCL) or a mask of your own.

A plain folder (data/folder.py) may hold, beside S2/, one of

    SCL/<anything>_YYYYMMDD.tif    the L2A product's scene classification: 1 band, uint8 codes 0..11
    MASK/<anything>_YYYYMMDD.tif   1 band: uint8 0/1 (1 = cloud) or float32 cloud probability 0..1

matched to the S2 images by date, one for every S2 date. Either becomes the store's cloud
probability (`cloud_prob`) and the pixel mask every part of vcloud uses: a pixel is cloud where
its probability is at least MASK_MIN_PROB (0.4, s2cloudless's threshold, which the samplers,
losses and baselines read as "cloudy"), as stored, with no averaging or dilation. Cloud cover
and the clear/thin/thick/opaque class follow from it as for s2cloudless (data/clouds.py): thin
where the mean probability over the masked pixels is below `thick_min_prob` (0.7).

SCL codes (Sen2Cor): 0 no data, 1 saturated or defective, 2 dark area (cast shadows from
baseline 04.00), 3 cloud shadows, 4 vegetation, 5 not vegetated, 6 water, 7 unclassified,
8 cloud medium probability, 9 cloud high probability, 10 thin cirrus, 11 snow or ice. Which
codes count as cloud, cirrus and shadow is the table SCL_CLOUD_PROB (data.scl_cloud_prob in
the workflow config, `vcloud prepare --scl CODE=PROB`): the cloud probability each code stands
for; a code not in the table is clear (0). The default:

| code | class | probability | so |
| --- | --- | --- | --- |
| 0 | no data | 1.0 | masked (reconstructed, never ground truth) |
| 1 | saturated or defective | 1.0 | masked |
| 3 | cloud shadows | 0.5 | masked; alone, a thin image |
| 8 | cloud, medium probability | 0.8 | masked; thick |
| 9 | cloud, high probability | 1.0 | masked; thick (opaque over >= 95 %) |
| 10 | thin cirrus | 0.5 | masked; alone, a thin image |

A code given a probability below 0.4 is not masked but reaches the models' cloud channel.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vcloud.constants import S2CLOUDLESS_KWARGS
from vcloud.data.geotiff import NO_GEOREF, BadImageError, GeoRef, read_image
from vcloud.errors import BadInputError

MASK_MIN_PROB = S2CLOUDLESS_KWARGS["threshold"]  # a supplied mask's pixel is cloud from this probability
SCL_CODES = {
    0: "no data",
    1: "saturated or defective",
    2: "dark area",
    3: "cloud shadows",
    4: "vegetation",
    5: "not vegetated",
    6: "water",
    7: "unclassified",
    8: "cloud medium probability",
    9: "cloud high probability",
    10: "thin cirrus",
    11: "snow or ice",
}
SCL_CLOUD_PROB: dict[int, float] = {0: 1.0, 1: 1.0, 3: 0.5, 8: 0.8, 9: 1.0, 10: 0.5}
MASK_KINDS = ("scl", "mask")  # folder names SCL/ and MASK/


def scl_table(table: dict | None = None) -> dict[int, float]:
    """A checked SCL code -> probability table (keys may be strings, as YAML or a CLI gives them)."""
    table = SCL_CLOUD_PROB if table is None else table
    checked: dict[int, float] = {}
    for key, value in table.items():
        try:
            code = int(key)
        except (TypeError, ValueError):
            raise BadInputError(f"data.scl_cloud_prob: {key!r} is not an SCL class code (0..11)") from None
        if code not in SCL_CODES:
            raise BadInputError(f"data.scl_cloud_prob: {code} is not an SCL class code (0..11)")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise BadInputError(f"data.scl_cloud_prob.{code}: {value!r} is not a probability 0..1")
        checked[code] = float(value)
    return dict(sorted(checked.items()))


def parse_scl_flags(flags: list[str] | None) -> dict[int, float]:
    """`--scl 9=1.0 --scl 10=0.5` -> the table (None or []: the default)."""
    if not flags:
        return scl_table()
    table = {}
    for flag in flags:
        code, sep, value = flag.partition("=")
        try:
            table[code.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise BadInputError(f"--scl {flag}: expected CODE=PROBABILITY (e.g. 9=1.0)")
    return scl_table(table)


@dataclass(frozen=True)
class MaskSpec:
    """Where a store's cloud mask comes from, as recorded in its attribute `cloud_mask`."""

    source: str  # "s2cloudless", "scl" or "mask"
    scl: dict[int, float] | None = None  # the SCL table, when source is "scl"
    s2cloudless_too: bool = False  # a supplied mask, and s2cloudless computed beside it for comparison

    def attrs(self) -> dict:
        if self.source == "s2cloudless":
            kwargs = S2CLOUDLESS_KWARGS
            rule = (
                f"s2cloudless probability, averaged over {kwargs['average_over']} px, threshold "
                f"{kwargs['threshold']}, dilated by {kwargs['dilation_size']} px"
            )
            return {"source": "s2cloudless", "pixel_mask": rule}
        out = {"source": self.source, "pixel_mask": f"stored probability >= {MASK_MIN_PROB}, as stored"}
        if self.scl is not None:
            out["scl_cloud_prob"] = {str(code): prob for code, prob in self.scl.items()}
        if self.s2cloudless_too:
            out["compared_with"] = "s2cloudless (cloud_cover_s2cloudless, cloud_agreement)"
        return out


def store_mask_source(recorded: dict | None) -> str:
    """The source in a store's attribute `cloud_mask`; stores written before it was recorded are s2cloudless's."""
    return (recorded or {}).get("source", "s2cloudless")


def read_supplied(
    path: Path, kind: str, *, size: int, table: dict[int, float], georef: GeoRef | None, window=None
) -> np.ndarray:
    """One SCL or MASK file -> (H, W) float32 cloud probability; one line naming the file if not usable.
    window: (row, column) of the patch in a larger scene (data/scenes.py), read alone; its grid is
    the scene's, checked when the folder was scanned."""
    from vcloud.data.scenes import read_window

    dtypes = (np.uint8,) if kind == "scl" else (np.uint8, np.float32)
    try:
        if window is None:
            data, mask_georef = read_image(path, bands=1, size=size, dtype=dtypes)
        else:
            data = read_window(path, row=window[0], col=window[1], size=size, bands=1, dtype=dtypes)
            mask_georef = georef
    except BadImageError as err:
        raise BadInputError(f"{path}: {err} ({_expected(kind)})") from None
    if NO_GEOREF not in (georef, mask_georef) and georef is not None and mask_georef != georef:
        raise BadInputError(
            f"{path}: on another grid than its S2 image ({mask_georef.crs} {mask_georef.transform} against "
            f"{georef.crs} {georef.transform})"
        )
    data = data[0]
    if kind == "scl":
        bad = np.setdiff1d(np.unique(data), list(SCL_CODES))
        if len(bad):
            raise BadInputError(f"{path}: values {_listed(bad)} are not SCL class codes (0..11)")
        lookup = np.zeros(256, np.float32)
        for code, prob in table.items():
            lookup[code] = prob
        return lookup[data]
    if data.dtype == np.uint8:
        bad = np.setdiff1d(np.unique(data), [0, 1])
        if len(bad):
            raise BadInputError(f"{path}: uint8 values {_listed(bad)}; a uint8 mask holds 0 (clear) and 1 (cloud)")
        return data.astype(np.float32)
    outside = ~((data >= 0.0) & (data <= 1.0))  # NaN included
    if outside.any():
        raise BadInputError(f"{path}: {int(outside.sum())} pixels outside 0..1 (a float32 mask is a probability)")
    return data.astype(np.float32)


def _expected(kind: str) -> str:
    if kind == "scl":
        return "SCL/ holds the scene classification: 1 band, uint8 codes 0..11"
    return "MASK/ holds 1 band: uint8 0/1 or float32 probability 0..1"


def _listed(values: np.ndarray, most: int = 5) -> str:
    shown = ", ".join(str(v) for v in values[:most].tolist())
    return shown + (f" (and {len(values) - most} more)" if len(values) > most else "")


def supplied_mask(prob: np.ndarray) -> np.ndarray:
    """(..., H, W) supplied probability -> uint8 mask (1 = cloud), as stored: no averaging, no dilation."""
    return (prob >= MASK_MIN_PROB).astype(np.uint8)


def agreement_lines(ds, store: Path, *, clear_max_cover: float) -> list[str]:
    """`vcloud verify`'s report on a store that keeps a supplied mask and s2cloudless's beside it.

    Per store: images compared, the mean and lowest fraction of pixels on which the two masks
    agree, the mean cover of each and their correlation, and how many images each calls clear.
    Empty for a store with one mask.
    """
    if "cloud_agreement" not in ds:
        return []
    source = store_mask_source(ds.attrs.get("cloud_mask")).upper()
    valid = ds["valid_s2"].values
    agree = ds["cloud_agreement"].values[valid]
    ours, theirs = ds["cloud_cover"].values[valid], ds["cloud_cover_s2cloudless"].values[valid]
    if not len(agree):
        return [f"{store}: cloud mask {source} against s2cloudless: no S2 image to compare"]
    worst = np.argwhere(valid)[int(np.argmin(agree))]
    where = f"{ds['location'].values[worst[0]]} at {str(ds['date_s2'].values[tuple(worst)])[:10]}"
    both = ours.std() > 0 and theirs.std() > 0
    corr = f"{np.corrcoef(ours, theirs)[0, 1]:.2f}" if both else "undefined (a constant cover)"
    return [
        f"{store}: cloud mask {source} against s2cloudless over {len(agree)} images: pixels agreeing "
        f"{agree.mean():.3f} on average, lowest {agree.min():.3f} ({where})",
        f"{store}: mean cloud cover {source} {ours.mean():.3f}, s2cloudless {theirs.mean():.3f}, correlation {corr}; "
        f"clear (cover < {clear_max_cover:g}): {source} {int((ours < clear_max_cover).sum())}, "
        f"s2cloudless {int((theirs < clear_max_cover).sum())}",
    ]
