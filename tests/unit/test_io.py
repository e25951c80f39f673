"""vcloud.io: outputs appear whole or not at all; temp names; provenance."""

import json
import os

import pytest

from vcloud import __version__, io


def test_temp_path_is_hidden_beside_the_output_and_names_the_pid(tmp_path):
    tmp = io.temp_path(tmp_path / "sub" / "best.pt")
    assert tmp == tmp_path / "sub" / f".best.pt.tmp-{os.getpid()}"


def test_atomic_write_text_bytes_json_write_exactly_the_content(tmp_path):
    io.atomic_write_text(tmp_path / "a" / "t.txt", "x\r\ny\n")
    io.atomic_write_bytes(tmp_path / "b.bin", b"\x00\xff")
    io.atomic_write_json(tmp_path / "c.json", {"b": 1, "a": [2]}, indent=1)
    assert (tmp_path / "a" / "t.txt").read_bytes() == b"x\r\ny\n"  # newlines as given
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff"
    assert (tmp_path / "c.json").read_text() == json.dumps({"b": 1, "a": [2]}, indent=1)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b.bin", "c.json", "t.txt"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    out = tmp_path / "m.jsonl"
    out.write_text("old\n")
    with pytest.raises(RuntimeError, match="boom"):
        with io.atomic_open(out, "w") as handle:
            handle.write("half")
            raise RuntimeError("boom")
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["m.jsonl"]


def test_the_output_appears_only_when_the_block_ends(tmp_path):
    out = tmp_path / "r.txt"
    with io.atomic_open(out, "w") as handle:
        handle.write("new")
        handle.flush()
        assert not out.exists()
        assert io.temp_path(out).read_text() == "new"
    assert out.read_text() == "new"


def test_atomic_output_replaces_a_folder_whole(tmp_path):
    out = tmp_path / "x.zarr"
    out.mkdir()
    (out / "old-chunk").write_text("1")
    with io.atomic_output(out) as tmp:
        tmp.mkdir()
        (tmp / "new-chunk").write_text("2")
        assert (out / "old-chunk").exists()  # the old folder is intact while the new one is written
    assert [p.name for p in out.iterdir()] == ["new-chunk"]
    assert [p.name for p in tmp_path.iterdir()] == ["x.zarr"]  # no .old- or .tmp- left


def test_atomic_output_removes_a_half_written_folder(tmp_path):
    out = tmp_path / "tree"
    out.mkdir()
    (out / "keep").write_text("1")
    with pytest.raises(KeyboardInterrupt):
        with io.atomic_output(out) as tmp:
            tmp.mkdir()
            (tmp / "part").write_text("2")
            raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["tree"]
    assert [p.name for p in out.iterdir()] == ["keep"]


def test_atomic_output_clears_a_temp_left_by_an_earlier_process_with_our_pid(tmp_path):
    out = tmp_path / "f.txt"
    io.temp_path(out).mkdir()  # a folder where the file's temp goes
    (io.temp_path(out) / "junk").write_text("x")
    io.atomic_write_text(out, "ok")
    assert out.read_text() == "ok"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_atomic_open_refuses_modes_that_do_not_write_a_new_file(tmp_path):
    with pytest.raises(ValueError, match="'a'"):
        with io.atomic_open(tmp_path / "x", "a"):
            pass
    assert list(tmp_path.iterdir()) == []


def test_fresh_staging_dir_removes_stale_ones_and_is_empty(tmp_path):
    (tmp_path / ".staging-1" / "images").mkdir(parents=True)
    (tmp_path / ".staging-x").write_text("stale file")
    (tmp_path / "index.html").write_text("keep")
    staging = io.fresh_staging_dir(tmp_path)
    assert staging == tmp_path / f".staging-{os.getpid()}"
    assert staging.is_dir() and not list(staging.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([staging.name, "index.html"])


def test_remove_leftover_temps_removes_only_our_temp_files(tmp_path):
    ours = [tmp_path / ".latest.pt.tmp-999999", tmp_path / ".metrics.jsonl.tmp-12"]
    for path in ours:
        path.write_bytes(b"half")
    kept = [tmp_path / "notes.tmp-1", tmp_path / ".x.tmp-abc", tmp_path / "best.pt"]
    for path in kept:
        path.write_bytes(b"keep")
    (tmp_path / ".store.zarr.tmp-5").mkdir()  # a folder: not removed by this file sweep
    assert io.remove_leftover_temps(tmp_path) == sorted(ours)
    assert all(p.exists() for p in kept) and (tmp_path / ".store.zarr.tmp-5").is_dir()
    assert not any(p.exists() for p in ours)


def test_provenance_names_the_version_and_a_revision():
    record = io.provenance()
    assert list(record) == ["vcloud_version", "git_revision"]
    assert record["vcloud_version"] == __version__
    revision = record["git_revision"]
    assert revision == "unknown" or (len(revision) >= 7 and all(c in "0123456789abcdef" for c in revision))


def test_git_revision_is_unknown_without_git(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert io.git_revision() == "unknown"
