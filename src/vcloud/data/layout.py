"""The raw SEN12MS-CR-TS tree: file names, paths, ROI discovery and S1/S2 pairing.

    <root>/ROIs1868/119/S2/7/s2_ROIs1868_119_ImgNo_7_2018-03-11_patch_42.tif

A location is (ROIs folder, roi number, patch id); roi numbers repeat across ROIs folders.
S1 and S2 are paired by the parsed (patch id, time index), never by listing order.

What is data and what is a problem (scan_roi):
- an S2 image without its S1 partner (no S1 file, or no S1 time folder, or no S1 at all) is a
  date without S1: kept with S2 only (RoiScan.s1_missing), not a problem;
- a time index with neither an S2 nor an S1 folder is an absent date (RoiScan.absent): the
  series is shorter than `times`, not a problem; folders past `times` are listed in
  RoiScan.beyond (not read);
- an S1 image without its S2 partner, an S2 time folder missing where the S1 one exists, a file
  whose name does not parse or lies in the wrong folder, a second image: problems.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from pathlib import Path

from vcloud.constants import N_TIMES
from vcloud.errors import BadInputError

KINDS = ("s1", "s2")
_NAME_RE = re.compile(
    r"^(?P<kind>s1|s2)_(?P<rois>ROIs\d{4})_(?P<roi>\d+)_ImgNo_(?P<t>\d+)_"
    r"(?P<date>\d{4}-\d{2}-\d{2})_patch_(?P<patch>\d+)\.tif$"
)
_ROI_RE = re.compile(r"^(?P<rois>ROIs\d{4})/(?P<roi>\d+)$")

# The dataset's regions and the reference loader's ROI lists per region and split (UnCRtainTS
# data/dataLoader.py). Train ROIs come in the train archives (s1_<region>.tar.gz, the
# reference's --root1); val and test ROIs in the test archives (s1_<region>_test.tar.gz, --root2).
REGION_SPLITS: dict[str, dict[str, tuple[str, ...]]] = {
    "africa": {
        "test": ("ROIs2017/32", "ROIs2017/140"),
        "val": ("ROIs2017/22",),
        "train": ("ROIs1970/21", "ROIs1970/35", "ROIs1970/40", "ROIs2017/8", "ROIs2017/61", "ROIs2017/75"),
    },
    "america": {
        "test": ("ROIs1158/106", "ROIs1970/132"),
        "val": ("ROIs1970/65",),
        "train": ("ROIs1868/36", "ROIs1868/85", "ROIs1970/82", "ROIs1970/142", "ROIs2017/49", "ROIs2017/116"),
    },
    "asiaEast": {
        "test": ("ROIs1868/73", "ROIs1868/119", "ROIs1970/139"),
        "val": ("ROIs2017/117",),
        "train": ("ROIs1868/114", "ROIs1868/126", "ROIs1868/143", "ROIs1970/116", "ROIs1970/135", "ROIs2017/25"),
    },
    "asiaWest": {
        "test": ("ROIs1868/100",),
        "val": ("ROIs1868/127",),
        "train": ("ROIs1970/57", "ROIs1970/83", "ROIs1970/112", "ROIs2017/69", "ROIs2017/115", "ROIs2017/130"),
    },
    "europa": {
        "test": ("ROIs2017/63", "ROIs2017/103", "ROIs2017/108", "ROIs1868/142", "ROIs1970/20"),
        "val": ("ROIs1868/17",),
        "train": (
            "ROIs1868/56",
            "ROIs1868/121",
            "ROIs1868/139",
            "ROIs1970/71",
            "ROIs1970/91",
            "ROIs1970/119",
            "ROIs1970/128",
            "ROIs1970/133",
            "ROIs1970/144",
            "ROIs1970/149",
            "ROIs2017/146",
        ),
    },
}
REGIONS: tuple[str, ...] = tuple(REGION_SPLITS)


@dataclass(frozen=True, order=True)
class RoiId:
    """A region of interest: the ROIs folder and the roi number inside it."""

    rois: str
    roi: int

    def __str__(self) -> str:
        return f"{self.rois}/{self.roi}"

    @property
    def slug(self) -> str:
        """File-name form, as in results/prepared/rois/{slug}.zarr."""
        return f"{self.rois}_{self.roi}"


def _dataset_rois() -> dict[RoiId, tuple[str, str]]:
    return {
        parse_roi(text): (region, split)
        for region, splits in REGION_SPLITS.items()
        for split, names in splits.items()
        for text in names
    }


def dataset_region(roi: RoiId) -> tuple[str, str] | None:
    """(region, split) of one of the dataset's 53 ROIs; None for an id the dataset does not have."""
    return _DATASET_ROIS.get(roi)


def dataset_rois() -> list[RoiId]:
    """The 53 ROIs of SEN12MS-CR-TS, sorted."""
    return sorted(_DATASET_ROIS)


def parse_roi(text: str) -> RoiId:
    """Parse 'ROIs1868/119' (or the slug 'ROIs1868_119')."""
    match = _ROI_RE.match(text.replace("_", "/", 1) if "/" not in text else text)
    if not match:
        raise BadInputError(f"ROI '{text}' does not parse: expected ROIsXXXX/NNN, e.g. ROIs1868/119")
    return RoiId(match["rois"], int(match["roi"]))


@dataclass(frozen=True)
class RawName:
    """The parsed name of one raw image file."""

    kind: str  # "s1" | "s2"
    rois: str
    roi: int
    t: int
    date: dt.date
    patch: int

    @property
    def filename(self) -> str:
        return f"{self.kind}_{self.rois}_{self.roi}_ImgNo_{self.t}_{self.date.isoformat()}_patch_{self.patch}.tif"

    def path(self, root: Path) -> Path:
        return Path(root) / self.rois / str(self.roi) / self.kind.upper() / str(self.t) / self.filename


def parse_name(filename: str) -> RawName:
    """Parse a raw file name; raises ValueError naming what does not parse."""
    match = _NAME_RE.match(filename)
    if not match:
        raise ValueError(
            "file name does not parse: expected <s1|s2>_<ROIsXXXX>_<roi>_ImgNo_<t>_<YYYY-MM-DD>_patch_<pid>.tif"
        )
    try:
        date = dt.date.fromisoformat(match["date"])
    except ValueError:
        raise ValueError(f"date '{match['date']}' in the file name is not a calendar date") from None
    return RawName(
        kind=match["kind"],
        rois=match["rois"],
        roi=int(match["roi"]),
        t=int(match["t"]),
        date=date,
        patch=int(match["patch"]),
    )


def discover_rois(root: Path) -> list[RoiId]:
    """Every <ROIsXXXX>/<roi> folder under an extracted raw root, sorted."""
    found = []
    for rois_dir in sorted(Path(root).glob("ROIs[0-9][0-9][0-9][0-9]")):
        for roi_dir in rois_dir.iterdir():
            if roi_dir.is_dir() and roi_dir.name.isdigit():
                found.append(RoiId(rois_dir.name, int(roi_dir.name)))
    return sorted(found)


class TreeSource:
    """An extracted raw root: <root>/ROIsXXXX/<roi>/{S1,S2}/<t>/<file>.tif.

    Every raw source (this one, and archives in vcloud.data.archive) answers the same four
    questions, so pairing and problem reporting are written once (scan_roi).
    """

    def __init__(self, root: Path):
        self.root = Path(root)

    def __str__(self) -> str:
        return str(self.root)

    def has(self, roi: RoiId, kind: str) -> bool:
        return (self.root / roi.rois / str(roi.roi)).is_dir()

    def list_folder(self, roi: RoiId, kind: str, t: int) -> list[tuple[str, bool]] | None:
        """(entry name, is a folder) of one time folder, sorted; None when the folder is missing."""
        folder = self.root / roi.rois / str(roi.roi) / kind.upper() / str(t)
        if not folder.is_dir():
            return None
        return [(path.name, path.is_dir()) for path in sorted(folder.iterdir())]

    def where(self, roi: RoiId, kind: str, t: int, filename: str = "") -> str:
        path = self.root / roi.rois / str(roi.roi) / kind.upper() / str(t)
        return str(path / filename) if filename else str(path)

    def open(self, name: RawName):
        """What read_image reads: here the file's path."""
        return name.path(self.root)


@dataclass
class Problem:
    """One bad file or folder: where, and what is wrong."""

    path: str
    reason: str
    kind: str = ""  # s1 | s2 | "" (whole folder)
    patch: int | None = None
    t: int | None = None


@dataclass
class RoiScan:
    """What a ROI holds, paired by (patch, t), and the source each kind is read from."""

    roi: RoiId
    times: int
    # (patch, t) -> {"s1": RawName, "s2": RawName}; a missing kind is absent from the dict.
    images: dict[tuple[int, int], dict[str, RawName]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    sources: dict = field(default_factory=dict)  # kind -> source (TreeSource, ArchiveSource)
    s1_missing: list[tuple[int, int]] = field(default_factory=list)  # (patch, t): S2 without S1, kept
    absent: list[int] = field(default_factory=list)  # t < times with neither an S2 nor an S1 folder
    beyond: list[int] = field(default_factory=list)  # t >= times with a folder: not read

    @property
    def patches(self) -> list[int]:
        return sorted({patch for patch, _ in self.images})

    def where(self, name: RawName) -> str:
        """The file as a person finds it: a path, or archive.tar.gz:member."""
        return self.sources[name.kind].where(self.roi, name.kind, name.t, name.filename)

    def open(self, name: RawName):
        return self.sources[name.kind].open(name)


def scan_roi(root, roi: RoiId, *, times: int = N_TIMES) -> RoiScan:
    """List and pair the raw files of one ROI; file-level problems are collected, not raised.

    `root` is an extracted raw root (a path), or a dict kind -> source for each of s1 and s2
    (vcloud.data.archive.resolve_sources). Raises BadInputError when the ROI is missing or
    holds no image at all.
    """
    if isinstance(root, dict):
        sources = root
        label = " and ".join(sorted({str(src) for src in sources.values()})) or "the raw sources"
    else:
        tree = TreeSource(root)
        if not tree.has(roi, "s2"):
            raise BadInputError(f"{Path(root) / roi.rois / str(roi.roi)}: ROI folder not found")
        sources = {kind: tree for kind in KINDS}
        label = str(Path(root) / roi.rois / str(roi.roi))
    scan = RoiScan(roi=roi, times=times, sources=sources)

    def folder(kind: str, t: int):
        source = sources.get(kind)
        return source.list_folder(roi, kind, t) if source is not None else None

    listed = {(kind, t): folder(kind, t) for kind in KINDS for t in range(times)}
    scan.absent = [t for t in range(times) if listed[("s1", t)] is None and listed[("s2", t)] is None]
    while any(folder(kind, times + len(scan.beyond)) is not None for kind in KINDS):
        scan.beyond.append(times + len(scan.beyond))
    for kind in KINDS:
        source = sources.get(kind)
        for t in range(times):
            entries = listed[(kind, t)]
            if entries is None:
                if kind == "s2" and t not in scan.absent:  # S1 without S2; a missing S1 is not a problem
                    where = source.where(roi, kind, t) if source is not None else f"{roi}/{kind.upper()}/{t}"
                    scan.problems.append(Problem(where, "missing time folder", kind=kind, t=t))
                continue
            for entry, is_dir in entries:
                _add_file(scan, source.where(roi, kind, t, entry), entry, is_dir, kind, t)
    if not scan.images:
        raise BadInputError(f"{label}: empty ROI {roi} (no parseable S1 or S2 image under S1/<t>/, S2/<t>/)")
    missing_folders = {(kind, t) for (kind, t), entries in listed.items() if entries is None}
    for (patch, t), pair in sorted(scan.images.items()):
        if "s1" not in pair:  # a date without S1: data (kept with S2 only), not a problem
            scan.s1_missing.append((patch, t))
        elif "s2" not in pair and ("s2", t) not in missing_folders:
            scan.problems.append(
                Problem(
                    sources["s2"].where(roi, "s2", t),
                    f"S2 partner missing for {pair['s1'].filename}",
                    kind="s2",
                    patch=patch,
                    t=t,
                )
            )
    return scan


def _add_file(scan: RoiScan, where: str, entry: str, is_dir: bool, kind: str, t: int) -> None:
    if is_dir:
        scan.problems.append(Problem(where, "unexpected folder inside a time folder", kind=kind, t=t))
        return
    try:
        name = parse_name(entry)
    except ValueError as err:
        scan.problems.append(Problem(where, str(err), kind=kind, t=t))
        return
    found = (name.kind, name.rois, name.roi, name.t)
    if found != (kind, scan.roi.rois, scan.roi.roi, t):
        scan.problems.append(
            Problem(
                where,
                f"file name says {name.kind}/{name.rois}/{name.roi}/t={name.t} "
                f"but the file lies in {kind.upper()}/{t} of {scan.roi}",
                kind=kind,
                t=t,
            )
        )
        return
    pair = scan.images.setdefault((name.patch, t), {})
    if kind in pair:
        scan.problems.append(
            Problem(
                where,
                f"second {kind.upper()} image for patch {name.patch} at t={t} (first: {pair[kind].filename})",
                kind=kind,
                patch=name.patch,
                t=t,
            )
        )
        return
    pair[kind] = name


_DATASET_ROIS = _dataset_rois()
