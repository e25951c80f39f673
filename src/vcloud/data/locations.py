"""Your own locations as the workflow's data source: one folder, a sub-folder per location.

    data:
      source: folder
      folder: /data/my_series            # <folder>/<location>/S2/..., S1/, SCL/ or MASK/
      locations: {train: [oslo, bergen], val: [tromso], test: [bodo]}

Each location named in `data.locations` is a sub-folder of `data.folder`, itself a plain folder as
`vcloud prepare --raw` reads it (data/folder.py: S2/ of dated GeoTIFFs, optional S1/, SCL/ or
MASK/; or tiles <tile>/S2/...). It is prepared on its own, into results/prepared/rois/<location>.zarr,
as the ROI `ROIs9000/<n>`, n its place among the locations in name order (1, 2, ...): the ROI id is
what the store's location ids carry (ROIs9000_<n>_p<patch>). A split store assembles its
locations' stores, so every patch of a scene stays in its location's split.

The time axis of every store is the longest series among the locations (data.times is the
dataset's 30 and is not read): a shorter series is stored with its dates, the rest missing, so
that the splits assemble. A location needs at least MIN_DATES dates with S2: the samplers of
training and evaluation take a clear target and at least one other date; with fewer dates than
a model's data.input_dates they repeat dates (docs/data.md, "Dates without S1, series of any
length").

Everything here is checked while the workflow is parsed, before any job, in one line naming the
key: a location named twice, one missing on disk or without S2/, an empty split, a series too short.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from vcloud.constants import SPLITS
from vcloud.data.layout import RoiId
from vcloud.errors import BadInputError, ConfigError

SOURCES = ("sen12mscrts", "folder")
FOLDER_ROIS = "ROIs9000"  # the ROIs folder of your own locations (no dataset ROI is in it)
MIN_DATES = 2
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Location:
    """One sub-folder of data.folder: its name (the file stem of its store), split, folder and ROI id."""

    name: str
    split: str
    path: Path
    roi: RoiId
    dates: int  # the most S2 dates any of its tiles has

    @property
    def slug(self) -> str:
        """File-name form, as a ROI's: results/prepared/rois/{slug}.zarr."""
        return self.name

    def s2_files(self) -> list[Path]:
        """Its S2 GeoTIFFs, every tile's (rule era5_wind's input: its places and dates)."""
        from vcloud.data.folder import FolderSource

        return FolderSource(self.path).s2_files()

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class FolderLocations:
    root: Path
    locations: tuple[Location, ...]  # in name order

    @property
    def times(self) -> int:
        """Dates per location in every store: the longest series."""
        return max(location.dates for location in self.locations)

    def split(self, split: str) -> list[Location]:
        return [location for location in self.locations if location.split == split]

    def get(self, name: str) -> Location:
        for location in self.locations:
            if location.name == name:
                return location
        raise ConfigError(f"data.locations: no location '{name}'")


def source_of(data: dict) -> str:
    """The workflow's data source: sen12mscrts (data.raw, or the synthetic stand-in) or folder."""
    return data.get("source", "sen12mscrts")


def is_folder_source(data: dict) -> bool:
    return source_of(data) == "folder"


def folder_source(config: dict) -> FolderLocations | None:
    """The locations when data.source is folder, else None; data.folder or data.locations beside
    another source is refused (the source would not be read)."""
    data = config["data"]
    if is_folder_source(data):
        return folder_locations(config)
    for key in ("folder", "locations"):
        if key in data:
            raise ConfigError(
                f"data.{key}: read only with data.source: folder (now {source_of(data)}); add data.source: folder "
                f"or remove data.{key}"
            )
    return None


def folder_locations(config: dict) -> FolderLocations:
    """The locations of a folder source, checked (module docstring); ConfigError in one line."""
    from vcloud.data.folder import FolderSource, is_plain_folder

    data = config["data"]
    if config.get("synthetic", {}).get("enabled"):
        raise ConfigError(
            "data.source: folder, but synthetic.enabled is true: set synthetic.enabled: false (else the synthetic "
            "data would be prepared)"
        )
    if not data.get("folder"):
        raise ConfigError("data.folder: required with data.source: folder (the folder whose sub-folders are locations)")
    locations = data.get("locations")
    if not isinstance(locations, dict):
        raise ConfigError(
            "data.locations: required with data.source: folder ({train: [...], val: [...], test: [...]}, each name a "
            "sub-folder of data.folder)"
        )
    root = Path(data["folder"])
    if not root.is_dir():
        raise ConfigError(f"data.folder: {root}: not a folder")
    unknown = sorted(set(locations) - set(SPLITS))
    if unknown:
        raise ConfigError(f"data.locations: unknown split {', '.join(unknown)} (allowed: {', '.join(SPLITS)})")
    split_of: dict[str, str] = {}
    for split in SPLITS:
        names = locations.get(split) or []
        if not names:
            raise ConfigError(f"data.locations.{split}: no location; every split (train, val, test) needs one")
        for name in names:
            key = f"data.locations.{split}"
            if not isinstance(name, str) or not NAME_RE.match(name):
                raise ConfigError(f"{key}: {name!r} is not a folder name (letters, digits, '_', '-', '.')")
            if name in split_of:
                where = "twice" if split_of[name] == split else f"also in data.locations.{split_of[name]}"
                raise ConfigError(f"{key}: '{name}' listed {where}; a location belongs to one split")
            split_of[name] = split
    found = []
    for number, name in enumerate(sorted(split_of), start=1):
        key = f"data.locations.{split_of[name]}"
        path = root / name
        if not path.is_dir():
            raise ConfigError(f"{key}: '{name}': no folder {path}")
        if not is_plain_folder(path):
            raise ConfigError(
                f"{key}: '{name}': {path} has no S2/ (or <tile>/S2/) folder of dated GeoTIFFs (docs/data.md, "
                "'Your own locations')"
            )
        try:
            dates = FolderSource(path).times
        except BadInputError as err:
            raise ConfigError(f"{key}: '{name}': {err}") from None
        if dates < MIN_DATES:
            raise ConfigError(
                f"{key}: '{name}': {dates} date with S2 in {path}; a location needs at least {MIN_DATES} (a clear "
                "target and another date, whatever data.input_dates): add dates or leave it out"
            )
        found.append(Location(name, split_of[name], path, RoiId(FOLDER_ROIS, number), dates))
    return FolderLocations(root, tuple(found))
