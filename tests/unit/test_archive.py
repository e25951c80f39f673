"""Raw input as downloaded: synthetic archives in the real naming, the index, bad archives,
and preparation from archives (identical to the extracted tree; parallel equals serial)."""

import gzip
import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from vcloud.cli import main
from vcloud.data.archive import (
    archive_for,
    build_index,
    index_path,
    parse_archive_name,
    read_index,
    write_archive,
)
from vcloud.data.layout import RoiId, dataset_region, dataset_rois
from vcloud.data.prepare import bad_tsv_path, prepare_roi
from vcloud.data.synthetic import default_rois, write_raw_tree

ARGS = {"patches": 2, "times": 3, "size": 16, "seed": 5}
ROIS = [RoiId("ROIs1868", 119), RoiId("ROIs1970", 119)]  # asiaEast test, europa train
ROI = ROIS[1]


@pytest.fixture(scope="module")
def raw_pair(tmp_path_factory):
    """The same synthetic data twice: as downloaded (archives) and as an extracted tree."""
    base = tmp_path_factory.mktemp("raw")
    write_raw_tree(base / "archives", rois=ROIS, archives=True, **ARGS)
    write_raw_tree(base / "tree", rois=ROIS, **ARGS)
    return base / "archives", base / "tree"


@pytest.fixture
def archives(raw_pair, tmp_path):
    copy = tmp_path / "archives"
    shutil.copytree(raw_pair[0], copy)
    return copy


def _files(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


def _prepare(raw, out, **kw):
    return prepare_roi(raw=raw, roi=ROI, out=out, times=ARGS["times"], size=ARGS["size"], **kw)


def test_the_dataset_has_53_rois_in_five_regions():
    rois = dataset_rois()
    assert len(rois) == 53 and len(set(rois)) == 53
    assert dataset_region(RoiId("ROIs1868", 119)) == ("asiaEast", "test")
    assert dataset_region(RoiId("ROIs1158", 119)) is None  # not in the dataset
    assert archive_for(RoiId("ROIs2017", 22), "s1").filename == "s1_africa_test.tar.gz"  # val: test archive
    assert archive_for(RoiId("ROIs1970", 119), "s2").filename == "s2_europa.tar.gz"
    assert archive_for(RoiId("ROIs1970", 119), "s2").top == "europa"
    assert archive_for(RoiId("ROIs1868", 119), "s1").top == "s1_asiaEast_test"
    assert parse_archive_name("s2_asiaWest_test.tar.gz").test and parse_archive_name("s3_x.tar.gz") is None


def test_default_synthetic_rois_are_dataset_rois_with_every_split():
    rois = default_rois(4)
    assert all(dataset_region(roi) for roi in rois)
    splits = {dataset_region(roi)[1] for roi in rois}
    assert splits == {"train", "val", "test"}
    assert len({roi.roi for roi in rois}) < len(rois)  # a roi number repeats across folders
    assert len(set(default_rois(53))) == 53
    assert all(dataset_region(roi)[1] == "train" for roi in default_rois(37)[4:])
    with pytest.raises(ValueError, match="only"):
        default_rois(60)


def test_synth_archives_have_the_real_names_and_inner_layout(raw_pair):
    archives, tree = raw_pair
    names = sorted(p.name for p in archives.iterdir())
    assert names == [
        "s1_asiaEast_test.tar.gz",
        "s1_europa.tar.gz",
        "s2_asiaEast_test.tar.gz",
        "s2_europa.tar.gz",
        "truth.csv",
        "wind.csv",
    ]
    with tarfile.open(archives / "s2_europa.tar.gz") as tar:
        members = [m.name for m in tar.getmembers() if m.isfile()]
        one = members[0]
        assert one.startswith("europa/ROIs1970/119/S2/")
        # Same bytes as the extracted tree's file.
        assert tar.extractfile(one).read() == (tree / one.split("/", 1)[1]).read_bytes()
    with tarfile.open(archives / "s1_asiaEast_test.tar.gz") as tar:
        assert all(n.startswith("s1_asiaEast_test") for n in tar.getnames())
    assert len(members) == ARGS["patches"] * ARGS["times"]
    with pytest.raises(ValueError, match="not in SEN12MS-CR-TS"):
        write_raw_tree(archives.parent / "x", rois=[RoiId("ROIs1158", 119)], archives=True, **ARGS)


def test_archive_round_trip_store_identical_to_the_extracted_tree(raw_pair, tmp_path):
    archives, tree = raw_pair
    from_archives, from_tree = tmp_path / "a" / "r.zarr", tmp_path / "t" / "r.zarr"
    _prepare(archives, from_archives, index_dir=tmp_path / "index")
    _prepare(tree, from_tree)
    a, t = _files(from_archives), _files(from_tree)
    assert a.keys() == t.keys()
    differ = [name for name in a if a[name] != t[name]]
    # Only the root metadata differs: its `source` attribute names the archives or the tree.
    assert differ == ["zarr.json"]
    assert b"s2_europa.tar.gz" in a["zarr.json"] and b"tar.gz" not in t["zarr.json"]
    assert (tmp_path / "index" / "s2_europa.tar.gz.vcloud-index").is_file()


def test_parallel_prepare_equals_serial_byte_for_byte(raw_pair, tmp_path):
    archives, _ = raw_pair
    serial, parallel = tmp_path / "1" / "r.zarr", tmp_path / "2" / "r.zarr"
    _prepare(archives, serial, workers=1, index_dir=tmp_path / "i")
    _prepare(archives, parallel, workers=2, index_dir=tmp_path / "i")
    assert _files(serial) == _files(parallel)
    assert bad_tsv_path(serial).read_bytes() == bad_tsv_path(parallel).read_bytes()


def test_two_roots_train_and_val_test_like_the_reference(raw_pair, tmp_path):
    archives, _ = raw_pair
    train, val_test = tmp_path / "train", tmp_path / "val_test"
    train.mkdir(), val_test.mkdir()
    for name in ("s1_europa.tar.gz", "s2_europa.tar.gz"):
        shutil.copy(archives / name, train / name)
    for name in ("s1_asiaEast_test.tar.gz", "s2_asiaEast_test.tar.gz"):
        shutil.copy(archives / name, val_test / name)
    code = main(
        [
            "prepare",
            "--raw",
            str(train),
            "--raw",
            str(val_test),
            "--roi",
            "ROIs1868/119",
            "--out",
            str(tmp_path / "t.zarr"),
            "--times",
            "3",
            "--size",
            "16",
            "--threads",
            "2",
        ]
    )
    assert code == 0 and (tmp_path / "t.zarr").is_dir()
    # One archive per --raw works too (each kind from its own archive).
    code = main(
        [
            "prepare",
            "--raw",
            str(train / "s1_europa.tar.gz"),
            "--raw",
            str(train / "s2_europa.tar.gz"),
            "--roi",
            str(ROI),
            "--out",
            str(tmp_path / "e.zarr"),
            "--times",
            "3",
            "--size",
            "16",
        ]
    )
    assert code == 0


def _rewrite(archive: Path, edit) -> None:
    """Rewrite an archive's members through edit(name, data) -> (name, data) | None."""
    with tarfile.open(archive) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]
    with gzip.open(archive, "wb") as gz, tarfile.open(fileobj=gz, mode="w") as out:
        for info, data in members:
            changed = edit(info.name, data)
            if changed is None:
                continue
            info.name, data = changed
            if data is not None:
                info.size = len(data)
            out.addfile(info, io.BytesIO(data) if data is not None else None)


def _cli(raw, out, policy="fail", index_dir=None):
    args = [
        "prepare",
        "--raw",
        str(raw),
        "--roi",
        str(ROI),
        "--out",
        str(out),
        "--on-bad-image",
        policy,
        "--times",
        "3",
        "--size",
        "16",
    ]
    return main(args + (["--index-dir", str(index_dir)] if index_dir else []))


def _one_line_naming(capsys, *words):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for word in words:
        assert word in err, err
    return err


def test_truncated_archive_one_line_exit_2_nothing_written(archives, tmp_path, capsys):
    archive = archives / "s2_europa.tar.gz"
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out.zarr"
    assert _cli(archives, out) == 2
    _one_line_naming(capsys, "s2_europa.tar.gz", "truncated or corrupt", "member")
    assert not out.exists() and not bad_tsv_path(out).exists()
    assert not index_path(archive).exists()
    assert os.listdir(tmp_path) == ["archives"]


def test_corrupt_archive_bytes_are_refused(archives, tmp_path, capsys):
    archive = archives / "s1_europa.tar.gz"
    data = bytearray(archive.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)
    archive.write_bytes(bytes(data))
    assert _cli(archives, tmp_path / "out.zarr") == 2
    _one_line_naming(capsys, "s1_europa.tar.gz")
    assert not (tmp_path / "out.zarr").exists()


def test_member_that_is_not_a_tiff_fails_or_is_skipped(archives, tmp_path, capsys):
    archive = archives / "s2_europa.tar.gz"
    bad = {}

    def garble(name, data):
        if data is not None and not bad and "/S2/1/" in name:
            bad["name"] = name
            return name, b"this is not a TIFF"
        return name, data

    _rewrite(archive, garble)
    out = tmp_path / "out.zarr"
    assert _cli(archives, out) == 2
    _one_line_naming(capsys, f"s2_europa.tar.gz:{bad['name']}", "not a readable TIFF")
    assert not out.exists()
    assert _cli(archives, out, policy="skip") == 0
    rows = bad_tsv_path(out).read_text().splitlines()
    assert len(rows) == 2 and rows[1].startswith(f"{archive}:{bad['name']}")
    from vcloud.data.store import open_store

    ds = open_store(out)
    assert int((~ds["valid_s2"].values).sum()) == 1  # masked; every good image kept
    assert int(ds["valid_s1"].values.sum()) == ARGS["patches"] * ARGS["times"]


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda n, d: (n.replace("europa/", "elsewhere/", 1), d), ("inner layout",)),
        (lambda n, d: (n.replace("/S2/", "/S1/"), d), ("S1/",)),
        (lambda n, d: (n.replace("ROIs1970/119", "ROIs1868/119"), d), ("belongs in s2_asiaEast_test.tar.gz",)),
    ],
    ids=["top-folder", "kind", "roi-of-another-archive"],
)
def test_archive_whose_inner_layout_is_not_the_datasets(archives, tmp_path, capsys, edit, words):
    _rewrite(archives / "s2_europa.tar.gz", edit)
    out = tmp_path / "out.zarr"
    assert _cli(archives, out, policy="skip") == 2  # a wrong archive is never skipped over
    _one_line_naming(capsys, "s2_europa.tar.gz:", *words)
    assert not out.exists()


def test_index_that_does_not_match_its_archive_is_refused_then_rebuilt(archives, raw_pair, tmp_path, capsys):
    index_dir = tmp_path / "index"
    assert _cli(archives, tmp_path / "first.zarr", index_dir=index_dir) == 0
    # The archive is replaced by another one of the same name (other seed): the index is stale.
    other = tmp_path / "other"
    write_raw_tree(other, rois=ROIS, archives=True, **{**ARGS, "seed": 9})
    shutil.copy(other / "s2_europa.tar.gz", archives / "s2_europa.tar.gz")
    capsys.readouterr()
    out = tmp_path / "out.zarr"
    assert _cli(archives, out, index_dir=index_dir) == 2
    _one_line_naming(capsys, "s2_europa.tar.gz.vcloud-index", "does not match", "vcloud index")
    assert not out.exists()
    assert main(["index", "--rebuild", "--index-dir", str(index_dir), str(archives / "s2_europa.tar.gz")]) == 0
    assert main(["index", "--check", "--index-dir", str(index_dir), str(archives / "s2_europa.tar.gz")]) == 0
    assert _cli(archives, out, index_dir=index_dir) == 0


def test_an_index_whose_offsets_are_wrong_is_caught_by_the_member_crc(archives, tmp_path, capsys):
    archive = archives / "s2_europa.tar.gz"
    index = build_index(archive, index_dir=tmp_path)
    for folders in index.rois.values():
        for members in folders.values():
            for member in members:
                member.offset += 512  # same archive, same fingerprint, wrong places
    from vcloud.data.archive import write_index

    write_index(index)
    assert read_index(archive, index_dir=tmp_path).members == ARGS["patches"] * ARGS["times"]
    out = tmp_path / "out.zarr"
    assert _cli(archives, out, index_dir=tmp_path) == 2
    _one_line_naming(capsys, "s2_europa.tar.gz:europa/ROIs1970/119/S2/", "CRC-32")
    assert not out.exists()


def test_write_archive_is_deterministic(tmp_path):
    name = parse_archive_name("s1_africa.tar.gz")
    files = [("ROIs1970/21/S1/0/a.tif", b"x" * 100)]
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first = write_archive(tmp_path / "a", name, files).read_bytes()
    assert write_archive(tmp_path / "b", name, files).read_bytes() == first
