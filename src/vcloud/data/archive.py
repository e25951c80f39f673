"""SEN12MS-CR-TS as downloaded: the 20 .tar.gz archives, read in place through an index.

Names and inner layout (util/dl_data.sh of PatrickTUM/SEN12MS-CR-TS):

    s2_africa.tar.gz        africa/ROIsXXXX/<roi>/S2/<t>/<file>.tif        train ROIs (--root1)
    s1_africa_test.tar.gz   s1_africa_test/ROIsXXXX/<roi>/S1/<t>/<file>.tif  val and test ROIs (--root2)

for the regions africa, america, asiaEast, asiaWest, europa. Which ROI lies in which archive is
fixed by the reference loader's region lists (vcloud.data.layout.REGION_SPLITS).

Why an index, not a streaming pass per job: a ROI's images are scattered over its part of the
archive, and one ROI job per ROI would otherwise decompress the whole archive (up to ~100 GB)
once per ROI: 17 times for europa. One pass per archive (rule index_archive) records every
member's offset, size and CRC-32 in the decompressed stream, and indexed_gzip's seek points
every SPACING bytes; a ROI job then decompresses only its own members, at most SPACING bytes
before each. The index lives beside its archive (<archive>.vcloud-index, one file) and records
the archive's size and a fingerprint of its first and last MiB: an index that does not match is
refused, never used. Every member read is checked against its CRC-32, so a wrong index or a
damaged archive is an error naming the archive and member, never silently wrong pixels.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
import tarfile
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

from vcloud.data.layout import KINDS, RawName, RoiId, TreeSource, dataset_region, parse_roi
from vcloud.errors import BadInputError

ARCHIVE_RE = re.compile(
    r"^(?P<kind>s1|s2)_(?P<region>africa|america|asiaEast|asiaWest|europa)(?P<test>_test)?\.tar\.gz$"
)
INDEX_SUFFIX = ".vcloud-index"
INDEX_MAGIC = b"VCLOUD-TAR-INDEX 1\n"
INDEX_VERSION = 1
# Decompressed bytes between two seek points. Each point keeps a 32 KiB window, so the index is
# about 32 KiB / SPACING of the decompressed size (0.8 % at 4 MiB), and a member read costs at
# most SPACING bytes of extra decompression (~15 ms): small next to decoding one image.
SPACING = 4 << 20
FINGERPRINT_BYTES = 1 << 20
_MEMBER_RE = re.compile(r"^(?P<rois>ROIs\d{4})/(?P<roi>\d+)/(?P<kind>S1|S2)/(?P<t>\d+)/(?P<file>[^/]+)$")


@dataclass(frozen=True)
class ArchiveName:
    """One of the 20 archives: s1|s2, region, and train or val/test part."""

    kind: str
    region: str
    test: bool

    @property
    def filename(self) -> str:
        return f"{self.kind}_{self.region}{'_test' if self.test else ''}.tar.gz"

    @property
    def top(self) -> str:
        """The archive's top folder, as dl_data.sh moves it: 'africa' or 's1_africa_test'."""
        return f"{self.kind}_{self.region}_test" if self.test else self.region


def parse_archive_name(filename: str) -> ArchiveName | None:
    match = ARCHIVE_RE.match(filename)
    if not match:
        return None
    return ArchiveName(match["kind"], match["region"], bool(match["test"]))


def archive_for(roi: RoiId, kind: str) -> ArchiveName:
    """The archive that holds one kind (s1|s2) of a dataset ROI."""
    found = dataset_region(roi)
    if found is None:
        raise BadInputError(f"ROI {roi} is not one of the 53 ROIs of SEN12MS-CR-TS, so no archive holds it")
    region, split = found
    return ArchiveName(kind, region, split != "train")


def rois_in(name: ArchiveName) -> list[RoiId]:
    """The dataset ROIs an archive holds (by the reference loader's lists)."""
    from vcloud.data.layout import REGION_SPLITS

    splits = ("val", "test") if name.test else ("train",)
    return sorted(parse_roi(text) for split in splits for text in REGION_SPLITS[name.region][split])


def index_path(archive: Path, index_dir: Path | None = None) -> Path:
    """Beside the archive by default; in `index_dir` when the download folder is not ours to
    write (the workflow keeps them in results/prepared/index/)."""
    archive = Path(archive)
    folder = Path(index_dir) if index_dir is not None else archive.parent
    return folder / (archive.name + INDEX_SUFFIX)


def index_file(archive, index_dir) -> str:
    """index_path as a string (for the workflow's input functions)."""
    return str(index_path(Path(archive), index_dir))


# ----------------------------------------------------------------------------- the index


@dataclass
class Member:
    name: str  # full member name inside the archive
    offset: int  # offset of the data in the decompressed stream
    size: int
    crc: int  # zlib.crc32 of the data


@dataclass
class ArchiveIndex:
    archive: Path
    path: Path  # where the index file is (or will be written)
    size: int
    fingerprint: str
    spacing: int
    # "ROIs1868/119" -> {(kind, t): [Member, ...]}; folders present without files map to [].
    rois: dict[str, dict[tuple[str, int], list[Member]]]
    gz_index: bytes  # indexed_gzip seek points (export_index)

    @property
    def members(self) -> int:
        return sum(len(v) for folders in self.rois.values() for v in folders.values())

    @property
    def data_bytes(self) -> int:
        return sum(m.size for folders in self.rois.values() for v in folders.values() for m in v)


def fingerprint(archive: Path) -> tuple[int, str]:
    """(size, sha256 of the first and last MiB): changes when the archive is replaced or cut."""
    archive = Path(archive)
    size = archive.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with archive.open("rb") as handle:
        digest.update(handle.read(FINGERPRINT_BYTES))
        handle.seek(max(0, size - FINGERPRINT_BYTES))
        digest.update(handle.read(FINGERPRINT_BYTES))
    return size, digest.hexdigest()


def _check_member(name: ArchiveName, archive: Path, member: str) -> tuple[RoiId, str, int, str] | None:
    """(roi, kind, t, file) of a file member; BadInputError when the path is not the dataset's."""
    parts = member.strip("/").split("/")
    if parts and parts[0] == ".":
        parts = parts[1:]
    if parts and parts[0] == name.top:
        parts = parts[1:]
    path = "/".join(parts)
    match = _MEMBER_RE.match(path)
    if not match:
        raise BadInputError(
            f"{archive}:{member}: not the dataset's inner layout "
            f"({name.top}/ROIsXXXX/<roi>/{name.kind.upper()}/<t>/<file>.tif)"
        )
    roi = RoiId(match["rois"], int(match["roi"]))
    kind = match["kind"].lower()
    if kind != name.kind:
        raise BadInputError(f"{archive}:{member}: {kind.upper()} image in an {name.kind.upper()} archive")
    expected = dataset_region(roi)
    if expected is not None and archive_for(roi, kind) != name:
        raise BadInputError(
            f"{archive}:{member}: ROI {roi} belongs in {archive_for(roi, kind).filename}, not {archive.name}"
        )
    return roi, kind, int(match["t"]), match["file"]


def _check_folder(name: ArchiveName, archive: Path, member: str) -> tuple[RoiId, str, int] | None:
    """A folder member: (roi, kind, t) for a time folder, None for a folder above one."""
    parts = [p for p in member.strip("/").split("/") if p != "."]
    if parts and parts[0] == name.top:
        parts = parts[1:]
    allowed = (r"ROIs\d{4}", r"\d+", name.kind.upper(), r"\d+")
    if len(parts) > len(allowed) or not all(re.fullmatch(a, p) for a, p in zip(allowed, parts)):
        raise BadInputError(
            f"{archive}:{member}/: folder not in the dataset's inner layout "
            f"({name.top}/ROIsXXXX/<roi>/{name.kind.upper()}/<t>/)"
        )
    if len(parts) == 4:
        return RoiId(parts[0], int(parts[1])), name.kind, int(parts[3])
    return None


def build_index(archive: Path, *, spacing: int = SPACING, index_dir: Path | None = None) -> ArchiveIndex:
    """One pass over the archive: every member's place and CRC-32, and gzip seek points."""
    import indexed_gzip

    archive = Path(archive)
    name = parse_archive_name(archive.name)
    if name is None:
        raise BadInputError(f"{archive}: not a SEN12MS-CR-TS archive name ({{s1,s2}}_<region>[_test].tar.gz)")
    if not archive.is_file():
        raise BadInputError(f"{archive}: archive not found")
    size, print_ = fingerprint(archive)
    rois: dict[str, dict[tuple[str, int], list[Member]]] = {}
    last = "(start of archive)"
    try:
        with indexed_gzip.IndexedGzipFile(str(archive), spacing=spacing) as gz:
            with tarfile.open(fileobj=gz, mode="r|") as tar:
                for info in tar:
                    last = info.name
                    if info.isdir():
                        found = _check_folder(name, archive, info.name)
                        if found:
                            roi, kind, t = found
                            rois.setdefault(str(roi), {}).setdefault((kind, t), [])
                        continue
                    if not info.isfile():
                        raise BadInputError(f"{archive}:{info.name}: not a regular file (links are not the dataset's)")
                    roi, kind, t, _ = _check_member(name, archive, info.name)
                    data = tar.extractfile(info).read()
                    if len(data) != info.size:
                        raise EOFError(f"member data cut at {len(data)} of {info.size} bytes")
                    member = Member(info.name, info.offset_data, info.size, zlib.crc32(data))
                    rois.setdefault(str(roi), {}).setdefault((kind, t), []).append(member)
            buffer = io.BytesIO()
            gz.export_index(fileobj=buffer)
    except BadInputError:
        raise
    except Exception as err:  # gzip, zlib, tarfile and indexed_gzip raise many types
        raise BadInputError(
            f"{archive}: truncated or corrupt archive at member {last} ({type(err).__name__}: {err})"
        ) from None
    if not rois:
        raise BadInputError(f"{archive}: no ROI in the archive (empty or not the dataset's layout)")
    return ArchiveIndex(archive, index_path(archive, index_dir), size, print_, spacing, rois, buffer.getvalue())


def write_index(index: ArchiveIndex) -> Path:
    """Write the index (temp file + rename: a reader sees the old index or the new one)."""
    path = index.path
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {
        "version": INDEX_VERSION,
        "archive": index.archive.name,
        "size": index.size,
        "fingerprint": index.fingerprint,
        "spacing": index.spacing,
        "rois": {
            roi: [
                [kind, t, [[m.name, m.offset, m.size, m.crc] for m in members]]
                for (kind, t), members in sorted(folders.items())
            ]
            for roi, folders in sorted(index.rois.items())
        },
    }
    body = zlib.compress(json.dumps(header, separators=(",", ":")).encode(), 6)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        with tmp.open("wb") as handle:
            handle.write(INDEX_MAGIC + struct.pack("<Q", len(body)) + body + index.gz_index)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_index(
    archive: Path, *, index_dir: Path | None = None, check: bool = True, header_only: bool = False
) -> ArchiveIndex:
    """The index of `archive`; BadInputError when missing, unreadable or not this archive's."""
    archive = Path(archive)
    path = index_path(archive, index_dir)
    try:
        with path.open("rb") as handle:
            magic = handle.read(len(INDEX_MAGIC))
            if magic != INDEX_MAGIC:
                raise ValueError("not a vcloud archive index")
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(zlib.decompress(handle.read(length)))
            gz_index = b"" if header_only else handle.read()
    except FileNotFoundError:
        raise BadInputError(f"{path}: index of {archive.name} not found (build it: vcloud index {archive})") from None
    except (OSError, ValueError, struct.error, zlib.error) as err:
        raise BadInputError(
            f"{path}: unreadable index ({type(err).__name__}: {err}); rebuild it: vcloud index {archive}"
        ) from None
    index = ArchiveIndex(
        archive=archive,
        path=path,
        size=header["size"],
        fingerprint=header["fingerprint"],
        spacing=header["spacing"],
        rois={
            roi: {(kind, t): [Member(*m) for m in members] for kind, t, members in folders}
            for roi, folders in header["rois"].items()
        },
        gz_index=gz_index,
    )
    if check:
        if not archive.is_file():
            raise BadInputError(f"{archive}: archive not found (its index {path.name} is there)")
        size, print_ = fingerprint(archive)
        if header.get("archive") != archive.name or (size, print_) != (index.size, index.fingerprint):
            raise BadInputError(
                f"{path}: index does not match {archive.name} (archive {size} bytes, index made for "
                f"{index.size} bytes{'' if size != index.size else ' with other content'}); "
                f"rebuild it: vcloud index {archive}"
            )
    return index


def ensure_index(archive: Path, *, index_dir: Path | None = None, rebuild: bool = False) -> ArchiveIndex:
    """The archive's index: read when it matches; built when missing (or asked to rebuild).

    A mismatched index is refused unless `rebuild`: it means the archive changed under a run,
    and several ROI jobs rebuilding one index at once would each decompress the whole archive.
    """
    archive = Path(archive)
    if not rebuild and index_path(archive, index_dir).exists():
        return read_index(archive, index_dir=index_dir)
    index = build_index(archive, index_dir=index_dir)
    write_index(index)
    return index


# ----------------------------------------------------------------------------- reading


class ArchiveSource:
    """One kind (s1|s2) of the ROIs in one archive, read through its index (vcloud.data.layout
    TreeSource's interface). Reads are serialised on one decompressor per archive (indexed_gzip
    is not thread-safe); decoding happens outside the lock."""

    def __init__(self, archive: Path, *, index_dir: Path | None = None):
        self.archive = Path(archive)
        self.index_dir = index_dir
        self.name = parse_archive_name(self.archive.name)
        if self.name is None:
            raise BadInputError(f"{archive}: not a SEN12MS-CR-TS archive name ({{s1,s2}}_<region>[_test].tar.gz)")
        self._index: ArchiveIndex | None = None
        self._gz = None
        self._lock = threading.Lock()

    def __str__(self) -> str:
        return str(self.archive)

    @property
    def index(self) -> ArchiveIndex:
        if self._index is None:
            self._index = ensure_index(self.archive, index_dir=self.index_dir)
        return self._index

    def has(self, roi: RoiId, kind: str) -> bool:
        return kind == self.name.kind and str(roi) in self.index.rois

    def list_folder(self, roi: RoiId, kind: str, t: int) -> list[tuple[str, bool]] | None:
        folders = self.index.rois.get(str(roi), {})
        if (kind, t) not in folders:
            return None
        return sorted((m.name.rsplit("/", 1)[-1], False) for m in folders[(kind, t)])

    def where(self, roi: RoiId, kind: str, t: int, filename: str = "") -> str:
        prefix = f"{self.name.top}/{roi.rois}/{roi.roi}/{kind.upper()}/{t}"
        members = self.index.rois.get(str(roi), {}).get((kind, t), [])
        if members:  # the real member path (the top folder may be absent)
            prefix = members[0].name.rsplit("/", 1)[0]
        return f"{self.archive}:{prefix}/{filename}" if filename else f"{self.archive}:{prefix}/"

    def member(self, name: RawName) -> Member:
        for m in self.index.rois.get(f"{name.rois}/{name.roi}", {}).get((name.kind, name.t), []):
            if m.name.rsplit("/", 1)[-1] == name.filename:
                return m
        raise BadInputError(f"{self.archive}: no member for {name.filename}")

    def open(self, name: RawName) -> io.BytesIO:
        """The member's bytes, checked against the CRC-32 recorded in the index."""
        member = self.member(name)
        where = f"{self.archive}:{member.name}"
        try:
            with self._lock:
                gz = self._decompressor()
                gz.seek(member.offset)
                data = gz.read(member.size)
        except BadInputError:
            raise
        except Exception as err:
            raise BadInputError(
                f"{where}: cannot read the member ({type(err).__name__}: {err}); "
                "the archive is damaged or its index is stale"
            ) from None
        if len(data) != member.size or zlib.crc32(data) != member.crc:
            raise BadInputError(
                f"{where}: member bytes do not match the index (CRC-32); the archive is "
                f"damaged or changed: rebuild the index with vcloud index {self.archive}"
            )
        return io.BytesIO(data)

    def _decompressor(self):
        if self._gz is None:
            import indexed_gzip

            gz = indexed_gzip.IndexedGzipFile(str(self.archive), spacing=self.index.spacing)
            gz.import_index(fileobj=io.BytesIO(self.index.gz_index))
            self._gz = gz
        return self._gz

    def close(self) -> None:
        if self._gz is not None:
            self._gz.close()
            self._gz = None


# ----------------------------------------------------------------------------- raw paths


def classify(path: Path) -> str:
    """'archive' (one .tar.gz), 'archives' (a folder holding some), or 'tree' (extracted)."""
    path = Path(path)
    if path.is_file():
        if parse_archive_name(path.name) is None:
            raise BadInputError(f"{path}: not a SEN12MS-CR-TS archive name ({{s1,s2}}_<region>[_test].tar.gz)")
        return "archive"
    if not path.is_dir():
        raise BadInputError(f"{path}: raw dataset not found (a folder of archives, one archive, or an extracted tree)")
    if any(parse_archive_name(p.name) for p in path.iterdir() if p.is_file()):
        return "archives"
    return "tree"


def archives_under(path: Path) -> list[Path]:
    path = Path(path)
    kind = classify(path)
    if kind == "archive":
        return [path]
    if kind == "archives":
        return sorted(p for p in path.iterdir() if p.is_file() and parse_archive_name(p.name))
    return []


def resolve_sources(
    raws: list[Path],
    roi: RoiId,
    *,
    index_dir: Path | None = None,
    s1_max_days: int | None = None,
    size: int | None = None,
    overlap: int | None = None,
) -> dict:
    """kind -> the one source that holds that kind of `roi`, over every raw path given.

    A raw path is a folder of downloaded archives, one archive, or an extracted tree (e.g. the
    reference code's two roots: train, and val/test), or a plain folder of dated GeoTIFFs
    (data/folder.py), read as whichever ROI is asked for. A kind found in two places is an error:
    which copy is meant cannot be guessed. s1_max_days: a plain folder's S1 pairing window (None:
    folder.S1_MAX_DAYS); size, overlap: the patches a plain folder's scenes are cut into
    (data/scenes.py; overlap None: its default).
    """
    from vcloud.data.folder import S1_MAX_DAYS, FolderSource, is_plain_folder

    found: dict[str, list] = {kind: [] for kind in KINDS}
    for raw in raws:
        raw = Path(raw)
        if is_plain_folder(raw):  # your own series: S2/, S1/ of dated files (data/folder.py)
            days = S1_MAX_DAYS if s1_max_days is None else s1_max_days
            folder = FolderSource(raw, s1_max_days=days, size=size, overlap=overlap)
            for kind in KINDS:
                if folder.has(roi, kind):
                    found[kind].append(folder)
            continue
        kind_of_path = classify(raw)
        if kind_of_path == "tree":
            tree = TreeSource(raw)
            if tree.has(roi, "s2"):
                for kind in KINDS:
                    found[kind].append(tree)
            continue
        for archive in archives_under(raw):
            name = parse_archive_name(archive.name)
            if dataset_region(roi) is not None and archive_for(roi, name.kind) != name:
                continue  # by its name this archive cannot hold the ROI: its index is not read
            source = ArchiveSource(archive, index_dir=index_dir)
            if source.has(roi, name.kind):
                found[name.kind].append(source)
    for kind, sources in found.items():
        if len(sources) > 1:
            raise BadInputError(f"ROI {roi}: {kind.upper()} found in both {sources[0]} and {sources[1]}")
    if not any(found.values()):
        if len(raws) == 1 and classify(raws[0]) == "tree":
            raise BadInputError(f"{Path(raws[0]) / roi.rois / str(roi.roi)}: ROI folder not found")
        where = ", ".join(str(r) for r in raws)
        expected = ""
        if dataset_region(roi) is not None:
            expected = f" (expected in {archive_for(roi, 's1').filename} and {archive_for(roi, 's2').filename})"
        raise BadInputError(f"ROI {roi}: not found under {where}{expected}")
    return {kind: sources[0] for kind, sources in found.items() if sources}


def discover_raw_rois(raws: list[Path]) -> list[RoiId]:
    """ROIs under the raw paths: those the archives hold by their names (no index needed), and
    the ROIsXXXX/<roi> folders of extracted trees."""
    from vcloud.data.layout import discover_rois

    found: set[RoiId] = set()
    for raw in raws:
        if classify(Path(raw)) == "tree":
            found.update(discover_rois(Path(raw)))
        for archive in archives_under(raw):
            found.update(rois_in(parse_archive_name(archive.name)))
    return sorted(found)


def check_data_config(config: dict) -> None:
    """Keys that changed meaning: one line saying what to write instead."""
    from vcloud.errors import ConfigError

    if "raw_dir" in config.get("data", {}):
        raise ConfigError(
            "data.raw_dir: renamed to data.raw (a path or a list of paths: a folder of the downloaded "
            "{s1,s2}_<region>[_test].tar.gz archives, one archive, or an extracted tree)"
        )


# ----------------------------------------------------------------------------- writing


def write_archive(out: Path, name: ArchiveName, files: list[tuple[str, bytes]]) -> Path:
    """Write one archive in the real inner layout (members relative to the top folder),
    folders first as tar does, atomically. Deterministic: fixed mtimes, owners and gzip header."""
    out = Path(out)
    target = out / name.filename
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    folders: set[str] = set()
    for relpath, _ in files:
        parts = relpath.split("/")[:-1]
        folders.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    try:
        with (
            tmp.open("wb") as raw,
            _gzip_writer(raw) as gz,
            tarfile.open(fileobj=gz, mode="w|", format=tarfile.GNU_FORMAT) as tar,
        ):
            entries = [(f, None) for f in sorted(folders)] + sorted(files)
            for relpath, data in [(name.top, None)] + entries:
                info = tarfile.TarInfo(relpath if relpath == name.top else f"{name.top}/{relpath}")
                info.mtime, info.uid, info.gid, info.uname, info.gname = 1514764800, 0, 0, "", ""
                if data is None:
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                else:
                    info.size, info.mode = len(data), 0o644
                    tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def _gzip_writer(raw):
    import gzip

    return gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0)
