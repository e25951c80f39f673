"""The raw SEN12MS-CR-TS tree: file names, paths, ROI discovery and S1/S2 pairing.

    <root>/ROIs1868/119/S2/7/s2_ROIs1868_119_ImgNo_7_2018-03-11_patch_42.tif

A location is (ROIs folder, roi number, patch id); roi numbers repeat across ROIs folders.
S1 and S2 are paired by the parsed (patch id, time index), never by listing order.
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
        return (
            f"{self.kind}_{self.rois}_{self.roi}_ImgNo_{self.t}_"
            f"{self.date.isoformat()}_patch_{self.patch}.tif"
        )

    def path(self, root: Path) -> Path:
        return Path(root) / self.rois / str(self.roi) / self.kind.upper() / str(self.t) / self.filename


def parse_name(filename: str) -> RawName:
    """Parse a raw file name; raises ValueError naming what does not parse."""
    match = _NAME_RE.match(filename)
    if not match:
        raise ValueError(
            "file name does not parse: expected "
            "<s1|s2>_<ROIsXXXX>_<roi>_ImgNo_<t>_<YYYY-MM-DD>_patch_<pid>.tif"
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
    """Every <ROIsXXXX>/<roi> folder under a raw root, sorted."""
    found = []
    for rois_dir in sorted(Path(root).glob("ROIs[0-9][0-9][0-9][0-9]")):
        for roi_dir in rois_dir.iterdir():
            if roi_dir.is_dir() and roi_dir.name.isdigit():
                found.append(RoiId(rois_dir.name, int(roi_dir.name)))
    return sorted(found)


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
    """What a ROI folder holds, paired by (patch, t)."""

    roi: RoiId
    times: int
    # (patch, t) -> {"s1": RawName, "s2": RawName}; a missing kind is absent from the dict.
    images: dict[tuple[int, int], dict[str, RawName]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    @property
    def patches(self) -> list[int]:
        return sorted({patch for patch, _ in self.images})


def scan_roi(root: Path, roi: RoiId, *, times: int = N_TIMES) -> RoiScan:
    """List and pair the raw files of one ROI; file-level problems are collected, not raised.

    Raises BadInputError when the ROI folder is missing or holds no image at all.
    """
    roi_dir = Path(root) / roi.rois / str(roi.roi)
    if not roi_dir.is_dir():
        raise BadInputError(f"{roi_dir}: ROI folder not found")
    scan = RoiScan(roi=roi, times=times)
    for kind in KINDS:
        kind_dir = roi_dir / kind.upper()
        for t in range(times):
            t_dir = kind_dir / str(t)
            if not t_dir.is_dir():
                scan.problems.append(Problem(str(t_dir), "missing time folder", kind=kind, t=t))
                continue
            for path in sorted(t_dir.iterdir()):
                _add_file(scan, path, kind, t)
    if not scan.images:
        raise BadInputError(f"{roi_dir}: empty ROI (no parseable S1 or S2 image under S1/<t>/, S2/<t>/)")
    missing_folders = {(p.kind, p.t) for p in scan.problems if p.reason == "missing time folder"}
    for (patch, t), pair in sorted(scan.images.items()):
        for kind in KINDS:
            if kind not in pair and (kind, t) not in missing_folders:
                other = pair["s2" if kind == "s1" else "s1"]
                where = other.path(root).parent.parent.parent / kind.upper() / str(t)
                scan.problems.append(
                    Problem(
                        str(where),
                        f"{kind.upper()} partner missing for {other.filename}",
                        kind=kind,
                        patch=patch,
                        t=t,
                    )
                )
    return scan


def _add_file(scan: RoiScan, path: Path, kind: str, t: int) -> None:
    if path.is_dir():
        scan.problems.append(Problem(str(path), "unexpected folder inside a time folder", kind=kind, t=t))
        return
    try:
        name = parse_name(path.name)
    except ValueError as err:
        scan.problems.append(Problem(str(path), str(err), kind=kind, t=t))
        return
    where = (name.kind, name.rois, name.roi, name.t)
    if where != (kind, scan.roi.rois, scan.roi.roi, t):
        scan.problems.append(
            Problem(
                str(path),
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
                str(path),
                f"second {kind.upper()} image for patch {name.patch} at t={t} "
                f"(first: {pair[kind].filename})",
                kind=kind,
                patch=name.patch,
                t=t,
            )
        )
        return
    pair[kind] = name
