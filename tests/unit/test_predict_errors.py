"""Every bad input of `vcloud predict`: one line naming it, exit 2, nothing written."""

from __future__ import annotations

import shutil

import pytest

from tests.unit.predict_fixtures import fails_in_one_line, predict_args, tiny_checkpoints

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoints(tmp_path_factory.mktemp("ckpt"))


_fails = fails_in_one_line


def test_bad_store_checkpoint_config_and_dates_are_one_line(tiny_store, ckpt, tmp_path, capsys):
    out = tmp_path / "out"
    missing = tmp_path / "nowhere.zarr"
    _fails(capsys, predict_args(missing, out, ckpt), out, f"{missing}: prepared store not found")
    _fails(
        capsys,
        predict_args(tiny_store, out, ckpt, "--dates", "2017-01-01"),
        out,
        f"{tiny_store}: date 2017-01-01 not in the store",
    )
    _fails(capsys, predict_args(tiny_store, out, ckpt, "--dates", "2018-13-01"), out, "--dates 2018-13-01")
    swapped = {**ckpt, 1: ckpt[2]}  # stage 2's weights given as stage 1's
    _fails(capsys, predict_args(tiny_store, out, swapped), out, f"{ckpt[2]}: checkpoint of stage 2, expected stage 1")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(ckpt[2].read_bytes()[:1000])
    _fails(
        capsys, predict_args(tiny_store, out, {**ckpt, 2: truncated}), out, f"{truncated}: not a readable checkpoint"
    )
    _fails(
        capsys, predict_args(tiny_store, out, {**ckpt, 2: tmp_path / "none.pt"}), out, "none.pt: checkpoint not found"
    )
    args = [a for a in predict_args(tiny_store, out, ckpt) if a not in ("--stage2", str(ckpt[2]))]
    _fails(capsys, args, out, "vcloud predict --stage 2 needs --stage2 CHECKPOINT")
    _fails(capsys, predict_args(tiny_store, out, {**ckpt, "config": tmp_path / "no.yaml"}), out, "no.yaml")


def test_damaged_store_is_named_and_nothing_is_written(tiny_store, ckpt, tmp_path, capsys):
    store = tmp_path / "store.zarr"
    shutil.copytree(tiny_store, store)
    shard = next(p for p in sorted((store / "s2" / "c" / "0").rglob("*")) if p.is_file())
    data = bytearray(shard.read_bytes())
    for offset in range(100, len(data) - 200, max(1, len(data) // 16)):  # every date's chunk: whichever is read
        data[offset] ^= 0xFF
    shard.write_bytes(bytes(data))
    out = tmp_path / "out"
    _fails(capsys, predict_args(store, out, ckpt), out, str(store), "ROIs1868_119_p0")
