"""A plain folder of dated GeoTIFFs (your own series) as a raw source of `vcloud prepare`.

    <folder>/S2/<anything>_YYYYMMDD.tif    13 bands, uint16, L1C reflectance x 10000, B1..B12 order
    <folder>/S1/<anything>_YYYYMMDD.tif    optional: 2 bands, float32 backscatter dB, VV then VH
    <folder>/SCL/<anything>_YYYYMMDD.tif   optional, or MASK/: the cloud mask that comes with the data
    <folder>/MASK/<anything>_YYYYMMDD.tif  (data/masks.py), one for every S2 date, matched by date

is one location; several locations (tiles of one area) are one folder each:

    <folder>/<tile>/S2/..., <folder>/<tile>/S1/...     tiles in name order are scenes 0, 1, ...

A scene of any size of at least the patch size is cut into overlapping patches (data/scenes.py),
each a location of the store: patches 0, 1, ... run over the scenes in name order, each scene's
patches row by row. A tile of exactly the patch size is one patch, read as before. Every date of a
scene must be on one grid (CRS, transform, size), S1/ and SCL/ or MASK/ images the same size.

The date is the end of the file name: YYYYMMDD or YYYY-MM-DD right before `.tif` / `.tiff`
(`S2/20180311.tif`, `S2/mytile_2018-03-11.tif`). Each S2 date is one time index, in date order;
a tile's dates need not be another tile's. Each S2 date is paired with the S1 image nearest in
time within s1_max_days (default S1_MAX_DAYS; `vcloud prepare --s1-max-days`, data.s1_max_days; ties: the earlier); an S2 date with none is a date without S1, and an S1
image no S2 date takes is not read (logged). SCL/ or MASK/ (not both) must hold an image of
every S2 date, and every tile of a folder the same kind; without either the mask is
s2cloudless's, computed from the S2 bands.

The source answers the four questions every raw source answers (layout.TreeSource), under the
dataset's own names: `vcloud prepare` reads the folder as it reads the dataset (layout.scan_roi),
and the store records the ROI name given with --roi. Problems name the real files.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from pathlib import Path

from vcloud.data.layout import RawName, RoiId
from vcloud.data.masks import MASK_KINDS
from vcloud.data.scenes import SceneGrid, check_overlap, default_overlap, patch_windows, scene_grid
from vcloud.errors import BadInputError

log = logging.getLogger(__name__)

S1_MAX_DAYS = 6  # the default window: one Sentinel-1 satellite's repeat is 12 days, every S2 date has one within 6
_DATE_RE = re.compile(r"(?:^|[^0-9])(\d{4})-?(\d{2})-?(\d{2})\.tiff?$", re.IGNORECASE)
NAMING = "<anything>_YYYYMMDD.tif or <anything>_YYYY-MM-DD.tif"


def is_plain_folder(path: Path) -> bool:
    """A folder with S2/ (one location) or <tile>/S2/ folders, and none of the dataset's ROIsNNNN."""
    path = Path(path)
    if not path.is_dir() or any(path.glob("ROIs[0-9][0-9][0-9][0-9]")):
        return False
    return (path / "S2").is_dir() or any((child / "S2").is_dir() for child in path.iterdir() if child.is_dir())


def file_date(path: Path) -> dt.date:
    match = _DATE_RE.search(Path(path).name)
    if not match:
        raise BadInputError(f"{path}: no date at the end of the file name (expected {NAMING})")
    try:
        return dt.date(*(int(v) for v in match.groups()))
    except ValueError:
        raise BadInputError(f"{path}: {''.join(match.groups())} in the file name is not a calendar date") from None


def _dated(folder: Path) -> list[tuple[dt.date, Path]]:
    """(date, file) of the GeoTIFFs in `folder`, by date; one line naming a second file of a date."""
    if not folder.is_dir():
        return []
    found: dict[dt.date, Path] = {}
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.suffix.lower() not in (".tif", ".tiff"):
            continue  # .aux.xml, notes: not images
        date = file_date(path)
        if date in found:
            raise BadInputError(f"{path}: a second image of {date} (first: {found[date].name})")
        found[date] = path
    return sorted(found.items())


def _pair(s2: list, s1: list, folder: Path, max_days: int = S1_MAX_DAYS) -> dict[int, tuple[dt.date, Path]]:
    """time index -> (S1 date, file): the S1 image nearest each S2 date, within max_days."""
    pairs = {}
    for t, (date, _) in enumerate(s2):
        near = [(abs((d - date).days), d, p) for d, p in s1 if abs((d - date).days) <= max_days]
        if near:
            _, d, p = min(near)
            pairs[t] = (d, p)
    unused = sorted({p.name for _, p in s1} - {p.name for _, p in pairs.values()})
    if unused:
        log.info(
            "%s: %d S1 images more than %d days from every S2 date, not read: %s",
            folder / "S1",
            len(unused),
            max_days,
            ", ".join(unused),
        )
    return pairs


class FolderSource:
    """A plain folder read as one ROI: patch = a window of a tile's scene, t = S2 date index (module
    docstring). Without `size` (a date count only) every tile is one patch."""

    def __init__(
        self, root: Path, *, s1_max_days: int = S1_MAX_DAYS, size: int | None = None, overlap: int | None = None
    ):
        if isinstance(s1_max_days, bool) or not isinstance(s1_max_days, int) or s1_max_days < 0:
            raise BadInputError(f"--s1-max-days {s1_max_days!r}: expected a whole number of days, 0 or more")
        self.root = Path(root)
        self.s1_max_days = s1_max_days
        if (self.root / "S2").is_dir():
            tiles = [self.root]
        else:
            tiles = sorted(child for child in self.root.iterdir() if (child / "S2").is_dir())
        self.tiles = tiles
        self.files: dict[tuple[str, int, int], tuple[dt.date, Path]] = {}  # (kind, tile, t) -> (date, file)
        self.times = 0
        self.mask_kind: str | None = None  # "scl" or "mask" when the folder brings its cloud mask
        self.overlap = (
            None if size is None else check_overlap(size, default_overlap(size) if overlap is None else overlap)
        )
        self.grids: list[SceneGrid | None] = []  # each tile's scene grid (with `size`)
        self.patches: list[tuple[int, int, int]] = []  # patch -> (tile, row, column) of its window
        for index, tile in enumerate(tiles):
            s2 = _dated(tile / "S2")
            if not s2:
                raise BadInputError(f"{tile / 'S2'}: no GeoTIFF ({NAMING})")
            for t, item in enumerate(s2):
                self.files[("s2", index, t)] = item
            for t, item in _pair(s2, _dated(tile / "S1"), tile, s1_max_days).items():
                self.files[("s1", index, t)] = item
            self._add_masks(index, tile, s2)
            self.times = max(self.times, len(s2))
            grid = None if size is None else self._scene(index, s2, size)
            self.grids.append(grid)
            windows = [(0, 0)] if grid is None else patch_windows(grid.height, grid.width, size, self.overlap)
            self.patches += [(index, row, col) for row, col in windows]
        self.size = size
        self.cut = any(g is not None and (g.height, g.width) != (size, size) for g in self.grids)
        if len(tiles) > 1:
            log.info("%s: tiles as scenes: %s", self.root, ", ".join(f"{t.name}=s{i}" for i, t in enumerate(tiles)))
        if self.cut:
            log.info(
                "%s: %s cut into %d patches of %d px overlapping by %d px",
                self.root,
                ", ".join(f"{t.name} {g.height}x{g.width}" for t, g in zip(tiles, self.grids)),
                len(self.patches),
                size,
                self.overlap,
            )

    def _scene(self, tile: int, s2: list[tuple[dt.date, Path]], size: int) -> SceneGrid:
        """The tile's grid: every S2 date on the first's, at least a patch each side; S1 and mask
        images of the same size. One line naming the file otherwise."""
        first_path = s2[0][1]
        grid = scene_grid(first_path)
        if grid.height < size or grid.width < size:
            raise BadInputError(
                f"{first_path}: {grid.height}x{grid.width} px, smaller than one {size} px patch; give a larger area "
                f"or prepare with a smaller --size (a model takes the patch size it was trained on)"
            )
        for _, path in s2[1:]:
            other = scene_grid(path)
            if other != grid:
                x0, pw, _, y0, _, ph = grid.transform
                fix = (
                    f"gdalwarp -t_srs {grid.crs or '<CRS>'} -tr {pw!r} {abs(ph)!r} -te {x0!r} {y0 + grid.height * ph!r} "
                    f"{x0 + grid.width * pw!r} {y0!r}"
                )
                raise BadInputError(
                    f"{path}: on another grid ({other.describe()}) than {first_path} ({grid.describe()}); resample it "
                    f"onto that grid ({fix}): every date of a location must be on one grid"
                )
        for kind in ("s1", self.mask_kind):
            for (k, index, _), (_, path) in self.files.items():
                if not kind or k != kind or index != tile:
                    continue
                other = scene_grid(path)
                if (other.height, other.width) != (grid.height, grid.width):
                    raise BadInputError(
                        f"{path}: {other.height}x{other.width} px, its S2 scene {first_path} is "
                        f"{grid.height}x{grid.width}; every image of a location must cover the S2 grid"
                    )
                if kind != "s1" and other.crs and grid.crs and other != grid:
                    raise BadInputError(
                        f"{path}: on another grid than its S2 image ({other.describe()} against {grid.describe()})"
                    )
        return grid

    def patch_georef(self, patch: int):
        """The GeoRef of a patch of a cut scene: the scene's transform shifted to its window."""
        tile, row, col = self.patches[patch]
        return self.grids[tile].window_georef(row, col)

    def scene_vars(self, patch: int) -> dict:
        """The store's record of where a patch lies (data/store.py): its window in its scene and the
        scene's index, size and geotransform, as one-location variables."""
        import numpy as np

        tile, row, col = self.patches[patch]
        grid = self.grids[tile]
        return {
            "scene": (("location",), np.array([tile], np.int32)),
            "window": (("location", "win"), np.array([[row, col, self.size, self.size]], np.int32)),
            "scene_shape": (("location", "hw"), np.array([[grid.height, grid.width]], np.int32)),
            "scene_transform": (("location", "gt"), np.array([grid.transform], np.float64)),
        }

    def window(self, patch: int) -> tuple[int, int] | None:
        """(row, column) of the patch in its scene, or None when its tile is read whole (one patch)."""
        tile, row, col = self.patches[patch]
        grid = self.grids[tile]
        return None if grid is None or (grid.height, grid.width) == (self.size, self.size) else (row, col)

    def _add_masks(self, index: int, tile: Path, s2: list[tuple[dt.date, Path]]) -> None:
        """SCL/ or MASK/ of one tile: one image per S2 date, the same kind in every tile."""
        kinds = [kind for kind in MASK_KINDS if (tile / kind.upper()).is_dir()]
        if len(kinds) > 1:
            raise BadInputError(f"{tile}: both SCL/ and MASK/; keep the one the cloud mask should come from")
        kind = kinds[0] if kinds else None
        if index and kind != self.mask_kind:
            has = lambda k: f"{k.upper()}/" if k else "no SCL/ or MASK/"  # noqa: E731
            raise BadInputError(
                f"{tile}: {has(kind)}, {self.tiles[0]}: {has(self.mask_kind)}; every tile needs the same kind of mask"
            )
        self.mask_kind = kind
        if kind is None:
            return
        folder = tile / kind.upper()
        masks = dict(_dated(folder))
        for t, (date, image) in enumerate(s2):
            if date not in masks:
                raise BadInputError(f"{folder}: no image of {date} (for {image.name}); every S2 date needs its mask")
            self.files[(kind, index, t)] = (date, masks[date])
        unused = sorted(masks.keys() - {date for date, _ in s2})
        if unused:
            log.info(
                "%s: %d images of dates without S2, not read: %s", folder, len(unused), ", ".join(map(str, unused))
            )

    def s2_files(self) -> list[Path]:
        """Every tile's S2 GeoTIFFs: what its places (headers) and dates (names) come from."""
        return sorted(path for (kind, _, _), (_, path) in self.files.items() if kind == "s2")

    def mask_file(self, patch: int, t: int) -> Path | None:
        """The SCL or MASK image of S2 date index `t` of tile `patch`; None without SCL/ or MASK/."""
        item = self.files.get((self.mask_kind, self.patches[patch][0], t)) if self.mask_kind else None
        return item[1] if item else None

    def __str__(self) -> str:
        return str(self.root)

    def has(self, roi: RoiId, kind: str) -> bool:
        return kind == "s2" or any(key[0] == kind for key in self.files)

    def _name(self, roi: RoiId, kind: str, patch: int, t: int) -> RawName:
        date = self.files[(kind, self.patches[patch][0], t)][0]
        return RawName(kind=kind, rois=roi.rois, roi=roi.roi, t=t, date=date, patch=patch)

    def list_folder(self, roi: RoiId, kind: str, t: int) -> list[tuple[str, bool]] | None:
        """The images of date index `t` under the dataset's names; [] when no tile has one."""
        if t >= self.times:
            return None
        return [
            (self._name(roi, kind, patch, t).filename, False)
            for patch, (tile, _, _) in enumerate(self.patches)
            if (kind, tile, t) in self.files
        ]

    def _file(self, kind: str, patch: int, t: int) -> Path:
        return self.files[(kind, self.patches[patch][0], t)][1]

    def where(self, roi: RoiId, kind: str, t: int, filename: str = "") -> str:
        if filename:
            try:
                from vcloud.data.layout import parse_name

                name = parse_name(filename)
                return str(self._file(kind, name.patch, t))
            except (ValueError, KeyError):
                pass
        return f"{self.root} ({kind.upper()} of date index {t})"

    def open(self, name: RawName) -> Path:
        """What read_image reads: the real file."""
        return self._file(name.kind, name.patch, name.t)


def folder_times(raws: list[Path]) -> int | None:
    """The date count of the plain folders among `raws` (the most any tile has); None if none is one."""
    counts = [FolderSource(raw).times for raw in raws if is_plain_folder(raw)]
    return max(counts) if counts else None
