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

One location is enough with a temporal split (data/splits.py temporal_ranges):

    data:
      locations: [oslo]                  # a list: every location in every split
      temporal_split: {val: [2018-06-01, 2018-07-31], test: [2018-10-01, 2018-12-31], gap_days: 30}

val and test are date ranges of every location, the training dates the others, more than gap_days
from both; each split store keeps only its dates (vcloud assemble --keep/--drop). The mapping form
{train: [...], val: [...], test: [...]} still works beside it, and then may name a location in
several splits.

Everything here is checked while the workflow is parsed, before any job, in one line naming the
key: a location named twice, one missing on disk or without S2/, an empty split, a series too short,
a bad temporal split, a split whose range leaves a location fewer than MIN_DATES dates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from vcloud.constants import SPLITS
from vcloud.data.layout import RoiId
from vcloud.data.store import DateRanges
from vcloud.errors import BadInputError, ConfigError

SOURCES = ("sen12mscrts", "folder")
FOLDER_ROIS = "ROIs9000"  # the ROIs folder of your own locations (no dataset ROI is in it)
MIN_DATES = 2
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Location:
    """One sub-folder of data.folder: its name (the file stem of its store), splits, folder and ROI id."""

    name: str
    splits: tuple[str, ...]  # one, or several with data.temporal_split (each split its dates)
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
    # data.temporal_split: each split's dates (data/splits.py temporal_ranges); None: every date
    temporal: dict[str, DateRanges] | None = field(default=None, hash=False)

    @property
    def times(self) -> int:
        """Dates per location in every store: the longest series."""
        return max(location.dates for location in self.locations)

    def split(self, split: str) -> list[Location]:
        return [location for location in self.locations if split in location.splits]

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
    for key in ("folder", "locations", "temporal_split"):
        if key in data:
            raise ConfigError(
                f"data.{key}: read only with data.source: folder (now {source_of(data)}); add data.source: folder "
                f"or remove data.{key}"
            )
    return None


def folder_locations(config: dict) -> FolderLocations:
    """The locations of a folder source, checked (module docstring); ConfigError in one line."""
    from vcloud.data.folder import FolderSource, is_plain_folder
    from vcloud.data.splits import temporal_ranges

    data = config["data"]
    if config.get("synthetic", {}).get("enabled"):
        raise ConfigError(
            "data.source: folder, but synthetic.enabled is true: set synthetic.enabled: false (else the synthetic "
            "data would be prepared)"
        )
    if not data.get("folder"):
        raise ConfigError("data.folder: required with data.source: folder (the folder whose sub-folders are locations)")
    temporal = None if data.get("temporal_split") is None else temporal_ranges(data["temporal_split"])
    splits_of = _splits_of(data.get("locations"), temporal=temporal is not None)
    root = Path(data["folder"])
    if not root.is_dir():
        raise ConfigError(f"data.folder: {root}: not a folder")
    found = []
    for number, name in enumerate(sorted(splits_of), start=1):
        splits = splits_of[name]
        key = "data.locations" if isinstance(data["locations"], list) else f"data.locations.{splits[0]}"
        path = root / name
        if not path.is_dir():
            raise ConfigError(f"{key}: '{name}': no folder {path}")
        if not is_plain_folder(path):
            raise ConfigError(
                f"{key}: '{name}': {path} has no S2/ (or <tile>/S2/) folder of dated GeoTIFFs (docs/data.md, "
                "'Your own locations')"
            )
        try:
            source = FolderSource(path)
        except BadInputError as err:
            raise ConfigError(f"{key}: '{name}': {err}") from None
        dates = source.times
        if dates < MIN_DATES:
            raise ConfigError(
                f"{key}: '{name}': {dates} date with S2 in {path}; a location needs at least {MIN_DATES} (a clear "
                "target and another date, whatever data.input_dates): add dates or leave it out"
            )
        for split in splits if temporal else ():
            held = _dates_in(source, temporal[split])
            if held < MIN_DATES:
                raise ConfigError(
                    f"data.temporal_split.{split}: '{name}' has {held} of its {dates} S2 dates there "
                    f"({temporal[split].describe()}); each split needs at least {MIN_DATES} of every location's (a "
                    "clear target and another date): move or widen the ranges"
                )
        found.append(Location(name, splits, path, RoiId(FOLDER_ROIS, number), dates))
    return FolderLocations(root, tuple(found), temporal)


def _splits_of(locations, *, temporal: bool) -> dict[str, tuple[str, ...]]:
    """name -> its splits, from data.locations: a mapping split -> names, or (with a temporal split)
    a list of names, each then in every split. ConfigError in one line naming the key."""
    if isinstance(locations, list):
        if not temporal:
            raise ConfigError(
                "data.locations: a list puts every location in every split, which needs data.temporal_split (its "
                "dates split by date ranges); else give {train: [...], val: [...], test: [...]}"
            )
        if not locations:
            raise ConfigError("data.locations: no location; name at least one sub-folder of data.folder")
        locations = {split: locations for split in SPLITS}
        where = {split: "data.locations" for split in SPLITS}
    elif isinstance(locations, dict):
        unknown = sorted(set(locations) - set(SPLITS))
        if unknown:
            raise ConfigError(f"data.locations: unknown split {', '.join(unknown)} (allowed: {', '.join(SPLITS)})")
        where = {split: f"data.locations.{split}" for split in SPLITS}
    else:
        raise ConfigError(
            "data.locations: required with data.source: folder ({train: [...], val: [...], test: [...]}, each name a "
            "sub-folder of data.folder; or a list of them with data.temporal_split)"
        )
    splits_of: dict[str, list[str]] = {}
    for split in SPLITS:
        names = locations.get(split) or []
        if not names:
            raise ConfigError(f"{where[split]}: no location; every split (train, val, test) needs one")
        seen = set()
        for name in names:
            key = where[split]
            if not isinstance(name, str) or not NAME_RE.match(name):
                raise ConfigError(f"{key}: {name!r} is not a folder name (letters, digits, '_', '-', '.')")
            if name in seen:
                raise ConfigError(f"{key}: '{name}' listed twice")
            seen.add(name)
            if name in splits_of and not temporal:
                raise ConfigError(
                    f"{key}: '{name}' listed also in data.locations.{splits_of[name][0]}; a location belongs to one "
                    "split (or give data.temporal_split: its dates then split by date ranges)"
                )
            splits_of.setdefault(name, []).append(split)
    return {name: tuple(splits) for name, splits in splits_of.items()}


def _dates_in(source, ranges: DateRanges) -> int:
    """S2 dates of a location in `ranges`: its tile with the most, as FolderSource.times counts."""
    import numpy as np

    per_tile: dict[int, list] = {}
    for (kind, tile, _), (date, _) in source.files.items():
        if kind == "s2":
            per_tile.setdefault(tile, []).append(np.datetime64(date, "D"))
    return max(int(ranges.mask(np.array(days)).sum()) for days in per_tile.values())
