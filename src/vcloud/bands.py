"""Sentinel-2 band sets: which bands a store holds and a model takes, named once.

A band set is a preset name or a list of band names in Sentinel-2 order:

| preset | bands | what it is |
| --- | --- | --- |
| l1c | B1 B2 B3 B4 B5 B6 B7 B8 B8A B9 B10 B11 B12 (13) | Level-1C, SEN12MS-CR-TS (the default) |
| l2a | B1 B2 B3 B4 B5 B6 B7 B8 B8A B9 B11 B12 (12) | Level-2A: every band but B10 (cirrus, not in the product) |
| 10m_20m | B2 B3 B4 B5 B6 B7 B8 B8A B11 B12 (10) | the bands at 10 and 20 m (no 60 m band) |

Imports only constants: the config, data and models read it.
"""

from __future__ import annotations

from vcloud.constants import S2_BANDS

BAND_SETS: dict[str, tuple[str, ...]] = {
    "l1c": S2_BANDS,
    "l2a": tuple(band for band in S2_BANDS if band != "B10"),
    "10m_20m": ("B2", "B3", "B4", "B5", "B6", "B7", "B8", "B8A", "B11", "B12"),
}
BANDS_10M = ("B2", "B3", "B4", "B8")
BANDS_20M = ("B5", "B6", "B7", "B8A", "B11", "B12")
PRODUCT_LEVELS = ("L1C", "L2A")


class BandSetError(ValueError):
    """A band set that is not one: names the key and what is wrong."""


def resolve_bands(value, *, key: str = "bands") -> tuple[str, ...]:
    """A preset name or a list of band names -> the band names, checked (known, once each, in order)."""
    if isinstance(value, str):
        if value in BAND_SETS:
            return BAND_SETS[value]
        if "," not in value:
            raise BandSetError(f"{key}: {value!r} is not a band set (presets: {', '.join(BAND_SETS)}, or a list)")
        value = [part.strip() for part in value.split(",")]
    bands = tuple(str(band) for band in value)
    unknown = [band for band in bands if band not in S2_BANDS]
    if unknown:
        raise BandSetError(f"{key}: {', '.join(unknown)} not Sentinel-2 band names ({' '.join(S2_BANDS)})")
    if len(set(bands)) != len(bands) or list(bands) != sorted(bands, key=S2_BANDS.index):
        raise BandSetError(f"{key}: {' '.join(bands)} must name each band once, in Sentinel-2 order")
    if len(bands) < 3 or not {"B2", "B3", "B4"} <= set(bands):
        raise BandSetError(f"{key}: {' '.join(bands)} lacks B2, B3 or B4 (true colour is read from them)")
    return bands


def model_bands(cfg) -> tuple[str, ...]:
    """The S2 bands a model set (config/models/*.yaml, data.bands) takes, in its input and output order."""
    return resolve_bands(cfg.data.bands, key="data.bands")


def band_set_name(bands: tuple[str, ...]) -> str:
    """The preset a band list is, or the list itself joined by spaces."""
    for name, preset in BAND_SETS.items():
        if tuple(bands) == preset:
            return name
    return " ".join(bands)


def rgb_indices(bands: tuple[str, ...]) -> tuple[int, int, int]:
    """Where B4, B3, B2 (red, green, blue) are in `bands`."""
    return tuple(bands.index(band) for band in ("B4", "B3", "B2"))  # type: ignore[return-value]


def describe_count(count: int) -> str:
    """What a file of `count` S2 bands probably holds, and what to do: for a wrong band count."""
    for name, preset in BAND_SETS.items():
        if count == len(preset):
            return f"{count} bands is the preset {name} ({' '.join(preset)}): prepare with --bands {name}"
    if count in (len(BANDS_10M), len(BANDS_20M)):
        return (
            f"{count} bands look like the bands of one resolution ({' '.join(BANDS_10M)} at 10 m, "
            f"{' '.join(BANDS_20M)} at 20 m): resample the 20 m bands to the 10 m grid and stack them "
            "with the 10 m bands into one file per date (gdalwarp -tr 10 10, then gdal_merge.py -separate)"
        )
    return "give one file per date with every band of the band set (--bands)"
