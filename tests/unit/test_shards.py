"""Store format 2: sharded, checksummed, files per location bounded, damage found and named."""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

from vcloud.cli import main
from vcloud.data.samples import CloudySamples
from vcloud.data.shards import DamagedStoreError, ShardLayout, ShardReader, verify
from vcloud.data.store import FILES_PER_LOCATION, IMAGE_VARS, STORE_METADATA_FILES, open_store, write_locations
from vcloud.errors import BadInputError

from ..conftest import TINY


def _copies(store: Path, count: int):
    """`count` one-location Datasets made from a real prepared store, with distinct ids."""
    ds = open_store(store)
    for i in range(count):
        one = ds.isel(location=slice(i % ds.sizes["location"], i % ds.sizes["location"] + 1)).load()
        one = one.assign_coords(location=np.array([f"ROIs1868_119_p{100 + i}"], dtype=object))
        for name in one.variables:
            one[name].encoding = {}
        one.attrs = ds.attrs
        yield one


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file())


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in _files(path):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def test_files_per_location_are_bounded_and_metadata_amortised(tiny_store, tmp_path):
    counts = {}
    for n in (2, 7):
        write_locations(_copies(tiny_store, n), tmp_path / f"{n}.zarr")
        counts[n] = len(_files(tmp_path / f"{n}.zarr"))
    per_location = (counts[7] - counts[2]) / 5
    assert per_location <= 4, f"{per_location} files per location (bound: 4)"
    assert per_location == FILES_PER_LOCATION
    assert per_location == len(IMAGE_VARS)  # one shard per image variable, nothing per table
    assert counts[2] - 2 * per_location < STORE_METADATA_FILES  # the fixed part: metadata and one chunk per table


def test_store_is_sharded_with_a_checksum_per_chunk(tiny_store):
    meta = json.loads((tiny_store / "s2" / "zarr.json").read_text())
    (codec,) = meta["codecs"]
    assert codec["name"] == "sharding_indexed"
    assert [c["name"] for c in codec["configuration"]["codecs"]] == ["bytes", "blosc", "crc32c"]
    assert codec["configuration"]["chunk_shape"][:2] == [1, 1]  # one image per inner chunk
    layout = ShardLayout.read(tiny_store, "s2")
    assert layout.shard_path(tiny_store, 1).is_file()
    assert open_store(tiny_store).attrs["format_version"] == 2


def test_writer_is_deterministic(tiny_store, tmp_path):
    write_locations(_copies(tiny_store, 3), tmp_path / "a.zarr")
    write_locations(_copies(tiny_store, 3), tmp_path / "b.zarr")
    assert _digest(tmp_path / "a.zarr") == _digest(tmp_path / "b.zarr")


def test_shard_reader_equals_xarray(tiny_store):
    reader, ds = ShardReader(tiny_store), open_store(tiny_store)
    raw = reader.read_raw(1, [3, 0, 2])
    np.testing.assert_array_equal(raw.s2, ds["s2"].values[1, [3, 0, 2]])
    np.testing.assert_array_equal(raw.s1, ds["s1"].values[1, [3, 0, 2]])
    prob = ds["cloud_prob"].values[1, [3, 0, 2]]
    np.testing.assert_allclose(np.where(raw.cloud_prob == 255, np.nan, raw.cloud_prob / 250), prob, atol=1e-7)


@pytest.fixture
def damaged(tiny_store, tmp_path):
    store = tmp_path / "ROIs1868_119.zarr"
    shutil.copytree(tiny_store, store)
    return store


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _one_line(err) -> str:
    text = str(err)
    assert "\n" not in text, text
    return text


def test_corrupt_chunk_is_one_line_naming_store_variable_location_and_date(damaged):
    _flip(ShardLayout.read(damaged, "s2").shard_path(damaged, 1), 40)  # inside the first chunk (t=0)
    reader = ShardReader(damaged)
    day = str(np.datetime64(reader.date_s2[1, 0], "D"))
    with pytest.raises(DamagedStoreError) as err:
        reader.read(1, [2, 0])
    assert _one_line(err.value).startswith(f"{damaged}: s2 of location ROIs1868_119_p1 at {day} (t=0): checksum")
    reader.read(1, [1, 2, 3])  # the other dates of the shard still read
    reader.read(0, [0])


def test_damage_reaches_training_as_one_line_through_a_worker(damaged):
    layout = ShardLayout.read(damaged, "s1")
    shard = layout.shard_path(damaged, 0)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # truncated
    samples = CloudySamples(damaged, dates=2, length=4, seed=0, clear_max_cover=1.01, raw=True)
    loader = DataLoader(samples, batch_size=4, num_workers=1)
    with pytest.raises(DamagedStoreError) as err:
        next(iter(loader))
    assert _one_line(err.value).startswith(f"{damaged}: s1 of location ROIs1868_119_p0 at every date: shard index")


def test_damaged_table_is_named(damaged):
    _flip(damaged / "cloud_cover" / "c" / "0" / "0", 5)
    with pytest.raises(DamagedStoreError, match="cloud_cover .per-location table.: checksum mismatch"):
        ShardReader(damaged)


def test_verify_lists_every_damaged_chunk_and_exits_non_zero(damaged, capsys):
    assert main(["verify", str(damaged)]) == 0
    assert "every chunk reads back" in capsys.readouterr().out
    _flip(ShardLayout.read(damaged, "s2").shard_path(damaged, 0), 40)
    s2 = ShardLayout.read(damaged, "s2").shard_path(damaged, 1)
    size = s2.stat().st_size
    index = np.frombuffer(s2.read_bytes()[size - 4 - 16 * TINY["times"] : size - 4], "<u8").reshape(-1, 2)
    _flip(s2, int(index[2, 0]) + 3)  # the chunk of t=2 only
    ShardLayout.read(damaged, "cloud_prob").shard_path(damaged, 1).unlink()
    _flip(damaged / "valid_s1" / "c" / "0" / "0", 3)
    assert main(["verify", str(damaged)]) == 2
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) == 4, lines
    assert any("valid_s1 (per-location table): checksum mismatch" in line for line in lines)
    assert any("s2 of location ROIs1868_119_p0" in line and "(t=0): checksum mismatch" in line for line in lines)
    assert any("s2 of location ROIs1868_119_p1" in line and "(t=2): checksum mismatch" in line for line in lines)
    assert any("cloud_prob of location ROIs1868_119_p1 at every date: shard file missing" in line for line in lines)
    assert captured.err.strip().splitlines() == [
        f"vcloud verify: error: {damaged}: 4 damaged (listed above); prepare the ROI again"
    ]
    assert len(verify(damaged)) == 4


def test_an_old_store_gets_one_line(damaged):
    meta = json.loads((damaged / "zarr.json").read_text())
    meta["attributes"]["format_version"] = 1
    (damaged / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(BadInputError, match=r"format_version 1, this vcloud reads 2: written by an older vcloud"):
        open_store(damaged)


def test_a_store_not_sharded_as_we_write_it_is_refused(damaged):
    meta = json.loads((damaged / "s1" / "zarr.json").read_text())
    meta["codecs"][0]["configuration"]["codecs"].pop()  # no crc32c
    (damaged / "s1" / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(BadInputError, match="s1 is not sharded as this vcloud writes it"):
        ShardReader(damaged)
