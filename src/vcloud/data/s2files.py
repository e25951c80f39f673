"""What an S2 file of a plain folder holds: its band set, product level and Level-2A offset.

`vcloud prepare --bands SET --level L1C|L2A [--boa-offset N]` declares them (vcloud.bands: the
presets l1c, l2a, 10m_20m or a list); each file's GDAL metadata, where it has some, must agree:

- band descriptions (B2 or B02, ...) that name Sentinel-2 bands must be the declared bands;
- PROCESSING_LEVEL (Level-1C / Level-2A) or PRODUCT_TYPE (S2MSI1C / S2MSI2A) must be the level;
- Level-2A reflectance is stored as DN = 10000 x reflectance - BOA_ADD_OFFSET, with an offset of
  -1000 from processing baseline 04.00 (25 January 2022) on and 0 before. The offset is the
  file's BOA_ADD_OFFSET (per band or for the file), else follows from its PROCESSING_BASELINE,
  else is --boa-offset, which is then required: a series across 2022 mixes both, and a wrong
  offset is a 10 % error on every pixel. The store holds reflectance x 10000 with the offset
  applied (DN + offset, clipped at 0), as an L1C store holds it.
- Level-1C carries the same offset from the same baseline on as RADIO_ADD_OFFSET; it is applied
  where a file's metadata give it or its PROCESSING_BASELINE. An L1C file without either is
  taken as it is (offset 0: the dataset's and every file before 2022).

s2cloudless needs the 13 L1C bands at top of atmosphere: it runs only for --bands l1c --level
L1C; any other band set or level needs the mask to come with the data (SCL/ or MASK/).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vcloud.bands import PRODUCT_LEVELS, band_set_name
from vcloud.constants import S2_BANDS
from vcloud.errors import BadInputError

TAG_GDAL_METADATA = 42112
NEW_BASELINE = 4.0  # processing baseline from which L2A carries BOA_ADD_OFFSET -1000, L1C RADIO_ADD_OFFSET -1000
NEW_BASELINE_OFFSET = -1000
_BAND = re.compile(r"^B0?(\d{1,2}A?)$", re.IGNORECASE)
_LEVELS = {"LEVEL-1C": "L1C", "LEVEL-2A": "L2A", "S2MSI1C": "L1C", "S2MSI2A": "L2A", "L1C": "L1C", "L2A": "L2A"}


@dataclass(frozen=True)
class S2Spec:
    """The declared S2 band set and product level of a prepare run."""

    bands: tuple[str, ...] = S2_BANDS
    level: str = "L1C"
    boa_offset: int | None = None  # --boa-offset: for Level-2A files whose metadata lack it

    def __post_init__(self) -> None:
        if self.level not in PRODUCT_LEVELS:
            raise BadInputError(f"--level {self.level}: not one of {', '.join(PRODUCT_LEVELS)}")
        if self.boa_offset is not None and self.level != "L2A":
            raise BadInputError(f"--boa-offset {self.boa_offset}: only Level-2A has a BOA_ADD_OFFSET (--level L2A)")

    @property
    def s2cloudless(self) -> bool:
        """Whether s2cloudless can compute the mask: the 13 Level-1C bands."""
        return self.level == "L1C" and self.bands == S2_BANDS

    def attrs(self) -> dict:
        out = {"bands": list(self.bands), "band_set": band_set_name(self.bands), "product_level": self.level}
        if self.level == "L2A":
            flag = "" if self.boa_offset is None else f", else {self.boa_offset} (--boa-offset)"
            out["boa_add_offset"] = f"added to every file: its BOA_ADD_OFFSET, else by its PROCESSING_BASELINE{flag}"
        return out


@dataclass
class FileMeta:
    """The GDAL metadata of one GeoTIFF that matter here."""

    items: dict[str, str] = field(default_factory=dict)  # dataset-level items
    band_items: dict[int, dict[str, str]] = field(default_factory=dict)  # per band (0-based)
    descriptions: dict[int, str] = field(default_factory=dict)


def read_meta(path: Path) -> FileMeta:
    """The GDAL metadata (TIFF tag 42112) of a file; empty when it has none or is unreadable."""
    import tifffile

    meta = FileMeta()
    try:
        with tifffile.TiffFile(path) as tif:
            tag = tif.pages.first.tags.get(TAG_GDAL_METADATA)
            text = tag.value if tag is not None else ""
        root = ET.fromstring(text) if text else None
    except Exception:  # an unreadable file is reported by read_image with its reason
        return meta
    for item in root if root is not None else []:
        name, value = item.get("name", ""), (item.text or "").strip()
        sample = item.get("sample")
        if sample is None:
            meta.items[name.upper()] = value
        elif item.get("role") == "description":
            meta.descriptions[int(sample)] = value
        else:
            meta.band_items.setdefault(int(sample), {})[name.upper()] = value
    return meta


def band_names(meta: FileMeta, count: int) -> tuple[str, ...] | None:
    """The Sentinel-2 bands the descriptions name (B02 -> B2), or None if they do not all name one."""
    names = []
    for i in range(count):
        match = _BAND.match(meta.descriptions.get(i, ""))
        name = f"B{match.group(1).upper()}" if match else None
        if name not in S2_BANDS:
            return None
        names.append(name)
    return tuple(names)


def check_s2_file(path, data: np.ndarray, spec: S2Spec, meta: FileMeta) -> tuple[np.ndarray, int | None]:
    """Check one S2 file against the declared band set and level; returns reflectance x 10000 (the
    L2A offset applied) and the offset applied (None for L1C). One line naming the file if wrong."""
    described = band_names(meta, len(data))
    if described is not None and described != spec.bands:
        raise BadInputError(
            f"{path}: its band descriptions say {' '.join(described)}, the declared bands are "
            f"{' '.join(spec.bands)}; prepare with --bands {band_set_name(described).replace(' ', ',')}"
        )
    said = _level(meta)
    if said is not None and said != spec.level:
        raise BadInputError(f"{path}: its metadata say {said}, declared {spec.level}; prepare with --level {said}")
    if spec.level != "L2A":
        offset = _add_offset(path, meta, spec, "RADIO_ADD_OFFSET")
        if offset:
            data = np.clip(data.astype(np.int32) + offset, 0, None).astype(np.uint16)
        return data, offset or None
    offset = _add_offset(path, meta, spec, "BOA_ADD_OFFSET")
    if offset:
        data = np.clip(data.astype(np.int32) + offset, 0, None).astype(np.uint16)
    return data, offset


def _level(meta: FileMeta) -> str | None:
    for key in ("PROCESSING_LEVEL", "PRODUCT_TYPE", "LEVEL"):
        value = meta.items.get(key, "").strip().upper()
        if value in _LEVELS:
            return _LEVELS[value]
    return None


def _add_offset(path, meta: FileMeta, spec: S2Spec, key: str) -> int:
    """The file's offset under `key` (BOA_ADD_OFFSET of Level-2A, RADIO_ADD_OFFSET of Level-1C),
    else by its processing baseline; for Level-2A else --boa-offset, else refused; for Level-1C
    without either, 0."""
    found = {v[key] for v in meta.band_items.values() if key in v}
    if key in meta.items:
        found.add(meta.items[key])
    try:
        offsets = {int(float(v)) for v in found}
        baseline = float(meta.items["PROCESSING_BASELINE"]) if "PROCESSING_BASELINE" in meta.items else None
    except ValueError as err:
        raise BadInputError(f"{path}: unreadable {key} or PROCESSING_BASELINE in its metadata ({err})") from None
    if len(offsets) > 1:
        raise BadInputError(f"{path}: {key} differs between bands ({sorted(offsets)}); vcloud takes one")
    if offsets:
        offset, why = offsets.pop(), key
    elif baseline is not None:
        offset, why = (NEW_BASELINE_OFFSET if baseline >= NEW_BASELINE else 0), f"processing baseline {baseline:05.2f}"
    elif spec.level != "L2A":
        return 0
    elif spec.boa_offset is not None:
        return spec.boa_offset
    else:
        raise BadInputError(
            f"{path}: Level-2A without BOA_ADD_OFFSET or PROCESSING_BASELINE in its metadata; give --boa-offset "
            f"{NEW_BASELINE_OFFSET} (processing baseline 04.00 on, from 25 January 2022) or --boa-offset 0 (before)"
        )
    if spec.boa_offset is not None and spec.boa_offset != offset:
        raise BadInputError(f"{path}: its {why} gives an offset of {offset}, --boa-offset says {spec.boa_offset}")
    return offset


def prepare_flags(data: dict) -> str:
    """`vcloud prepare`'s --bands, --level and --boa-offset from the workflow config's data section
    (keys bands, product_level, boa_offset; each only when set, so the default command is as it was)."""
    bands = data.get("bands")
    flags = {
        "--bands": ",".join(bands) if isinstance(bands, (list, tuple)) else bands,
        "--level": data.get("product_level"),
        "--boa-offset": data.get("boa_offset"),
    }
    return " ".join(f"{flag} {value}" for flag, value in flags.items() if value is not None)
