"""`vcloud bundle`: a round trip in a fresh process predicts bit-identically to the separate files;
a damaged bundle or one that does not fit the store is refused in one line, exit 2, nothing written."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

from tests.conftest import TINY, TINY_ROIS
from tests.unit.predict_fixtures import fails_in_one_line, predict_args, tiny_checkpoints

pytestmark = pytest.mark.usefixtures("one_thread")

ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
PREDICT = ("--dates", "2018-05-17", "--draws", "2")  # both locations, with the uncertainty file


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoints(tmp_path_factory.mktemp("ckpt"), wind=True)


def _report(path, stage):
    """The part of a `vcloud evaluate` report the card reads (figures made up, a definition matters)."""
    means = {"psnr": 31.25, "ssim": 0.875}
    protocol = {"protocol": "fixed", "dates": 2, "region": "all", "seed": 0}
    report = {
        "stage": stage,
        "store": "results/prepared/test.zarr",
        "config": "models.yaml",
        "protocols": {
            "fixed": {
                "protocol": protocol,
                "samples": 3,
                "model": {"mean": means, "by_class": {}},
                "least_cloudy_date": {"mean": {"psnr": 20.5, "ssim": 0.5}},
                "paired": {},
            }
        },
    }
    path.write_text(json.dumps(report))
    return path


def _bundle_args(ckpt, store, out, *extra):
    return [
        "bundle",
        "--stage",
        "2",
        "--stage1",
        str(ckpt[1]),
        "--stage2",
        str(ckpt[2]),
        "--config",
        str(ckpt["config"]),
        "--wind-cache",
        str(ckpt["wind"]),
        "--train-store",
        str(store),
        "--out",
        str(out),
        *extra,
    ]


@pytest.fixture(scope="module")
def bundle(ckpt, tiny_store, tmp_path_factory):
    from vcloud.cli import main

    folder = tmp_path_factory.mktemp("bundle")
    out = folder / "model.tar"
    assert main(_bundle_args(ckpt, tiny_store, out, "--eval", str(_report(folder / "stage2.json", 2)))) == 0
    return out


def _files(out):
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*.tif"))}


@pytest.mark.slow  # over 10 s: docs/contributing.md, test tiers
def test_round_trip_in_a_fresh_process_predicts_bit_identically(ckpt, bundle, tiny_store, tmp_path):
    from vcloud.cli import main

    reference = tmp_path / "reference"
    assert main(predict_args(tiny_store, reference, ckpt, "--wind-cache", str(ckpt["wind"]), *PREDICT)) == 0
    # A fresh process makes the bundle, another predicts from it.
    again = tmp_path / "again.tar"
    cli = [sys.executable, "-m", "vcloud.cli"]
    made = subprocess.run([*cli, *_bundle_args(ckpt, tiny_store, again)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    out = tmp_path / "out"
    args = ["predict", "--bundle", str(again), "--store", str(tiny_store), "--out", str(out), "--device", "cpu"]
    run = subprocess.run([*cli, *args, *PREDICT], capture_output=True, text=True, env=ONE_THREAD)
    assert run.returncode == 0, run.stderr
    expected, got = _files(reference), _files(out)
    assert sorted(got) == sorted(expected) and len(got) == 6  # 2 locations x prediction, cloud, uncertainty
    for name, data in got.items():
        assert data == expected[name], name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["bundle"]["path"] == str(again)
    assert manifest["request_id"] == json.loads((reference / "manifest.json").read_text())["request_id"]
    # --stage defaults to the bundle's (2); a stage it cannot predict is refused
    assert manifest["request"]["stage"] == 2


def test_bundle_is_deterministic_and_describes_the_model(ckpt, bundle, tiny_store, tmp_path):
    from vcloud.cli import main

    first = bundle.read_bytes()
    bundle.rename(tmp_path / "first.tar")  # the same command again (it is on the card), in a new process's place
    assert main(_bundle_args(ckpt, tiny_store, bundle, "--eval", str(_report(bundle.parent / "stage2.json", 2)))) == 0
    assert bundle.read_bytes() == first  # same inputs, same bytes
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        card = json.loads(tar.extractfile("model-card.json").read())
        text = tar.extractfile("model-card.md").read().decode()
        manifest = json.loads(tar.extractfile("vcloud-bundle.json").read())
    assert names[0] == "vcloud-bundle.json"
    assert (
        sorted(names[1:])
        == sorted(manifest["members"])
        == sorted(["model-card.json", "model-card.md", "config.yaml", "stage1.pt", "stage2.pt", "wind/scan_orders.npz"])
    )
    assert manifest["members"]["stage2.pt"]["bytes"] == ckpt[2].stat().st_size
    assert list(card["stages"]) == ["1", "2"] and card["default_stage"] == 2
    inputs = card["inputs"]
    assert inputs["s2"]["bands"][:3] == ["B1", "B2", "B3"] and len(inputs["s2"]["bands"]) == 13
    assert inputs["s1"]["bands"] == ["VV", "VH"]
    assert inputs["s2"]["normalisation"]["divide_by"] == 10000.0
    assert (inputs["input_dates"], inputs["patch_size"]) == (2, TINY["size"])
    assert card["training"]["rois"] == {"ROIs1868/119": "asiaEast (test split of SEN12MS-CR-TS)"}
    assert card["training"]["locations"] == TINY["patches"]
    figures = card["evaluation"]["2"]
    assert figures["protocols"]["fixed"]["mean"]["model"] == {"psnr": 31.25, "ssim": 0.875}
    assert figures["command"].startswith("vcloud evaluate --bundle <this bundle> --stage 2 --store ")
    assert "psnr 31.25" in text and "B1, B2, B3" in text and "T = 2 input dates" in text


_fails = fails_in_one_line


def _predict(bundle, store, out):
    return ["predict", "--bundle", str(bundle), "--store", str(store), "--out", str(out), "--device", "cpu"]


def test_damaged_bundle_is_refused_in_one_line(bundle, tiny_store, tmp_path, capsys):
    out = tmp_path / "out"
    with tarfile.open(bundle) as tar:
        offset = tar.getmember("stage1.pt").offset_data
    flipped = tmp_path / "flipped.tar"
    data = bytearray(bundle.read_bytes())
    data[offset + 500] ^= 0x01
    flipped.write_bytes(bytes(data))
    expected = f"{flipped}: member stage1.pt fails its SHA-256 check"
    _fails(capsys, _predict(flipped, tiny_store, out), out, "vcloud predict: error:", expected)
    for command in ("evaluate", "export-viewer"):  # the same check in the other commands that take --bundle
        args = [command, "--bundle", str(flipped), "--store", str(tiny_store), "--out", str(out)]
        _fails(capsys, args, out, f"vcloud {command}: error:", expected)
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(bundle.read_bytes()[: offset + 1000])
    _fails(capsys, _predict(truncated, tiny_store, out), out, f"{truncated}: ")
    _fails(capsys, _predict(tmp_path / "none.tar", tiny_store, out), out, "none.tar: bundle not found")
    not_tar = tmp_path / "weights.tar"
    not_tar.write_bytes(b"\0" * 100)
    _fails(capsys, _predict(not_tar, tiny_store, out), out, f"{not_tar}: not a readable bundle")


def _repack(bundle, out, *, card=None, format_version=None):
    """A forged bundle whose checksums agree: the card or the format version changed."""
    with tarfile.open(bundle) as tar:
        members = {info.name: tar.extractfile(info).read() for info in tar}
    manifest = json.loads(members.pop("vcloud-bundle.json"))
    if card is not None:
        members["model-card.json"] = json.dumps(card(json.loads(members["model-card.json"]))).encode()
        import hashlib

        manifest["members"]["model-card.json"] = {
            "bytes": len(members["model-card.json"]),
            "sha256": hashlib.sha256(members["model-card.json"]).hexdigest(),
        }
    if format_version is not None:
        manifest["format_version"] = format_version
    with tarfile.open(out, "w") as tar:
        for name, data in {"vcloud-bundle.json": json.dumps(manifest).encode(), **members}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def test_bundle_that_does_not_fit_the_store_is_refused(ckpt, bundle, tiny_store, tmp_path_factory, tmp_path, capsys):
    from vcloud.data.prepare import prepare_roi
    from vcloud.data.synthetic import write_raw_tree

    raw = tmp_path / "raw16"
    write_raw_tree(raw, rois=TINY_ROIS[:1], patches=1, times=TINY["times"], size=16, seed=1)
    small = tmp_path / "small.zarr"
    prepare_roi(raw=raw, roi=TINY_ROIS[0], out=small, times=TINY["times"], size=16)
    out = tmp_path / "out"
    _fails(
        capsys,
        _predict(bundle, small, out),
        out,
        f"{bundle}: does not fit {small}: 16x16 pixel images, the model takes 32x32",
    )
    swapped = _repack(
        bundle,
        tmp_path / "swapped.tar",
        card=lambda c: {
            **c,
            "inputs": {**c["inputs"], "s2": {**c["inputs"]["s2"], "bands": c["inputs"]["s2"]["bands"][::-1]}},
        },
    )
    _fails(capsys, _predict(swapped, tiny_store, out), out, f"{swapped}: does not fit {tiny_store}: S2 bands B1,")
    args = ["evaluate", "--bundle", str(swapped), "--store", str(tiny_store), "--out", str(out / "e.json")]
    _fails(capsys, args, out, "vcloud evaluate: error:", "S2 bands")
    future = _repack(bundle, tmp_path / "future.tar", format_version=99)
    _fails(capsys, _predict(future, tiny_store, out), out, f"{future}: bundle format_version 99, this vcloud reads 1")
    mixed = [*_predict(bundle, tiny_store, out), "--config", str(ckpt["config"])]
    _fails(capsys, mixed, out, "--bundle replaces --config")
    _fails(capsys, [*_predict(bundle, tiny_store, out), "--stage", "3"], out, f"{bundle}: has no stage 3")
