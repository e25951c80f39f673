"""Real imagery is not a special case (#27): `vcloud evaluate` and `vcloud predict`, run as a user
runs them (a subprocess, the CLI), on small stores whose dates lack S1, whose series is short,
that have a single date or no clear date. Each either works or stops with exactly one error line
naming the store (exit 2), never a traceback."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import vcloud
from tests.conftest import TINY, TINY_ROIS
from tests.unit.predict_fixtures import predict_args, tiny_checkpoints

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING) ")


def _without_s1(raw: Path) -> None:
    shutil.rmtree(raw / "ROIs1868/119/S1")


def _short(raw: Path) -> None:  # a series of 2 of the configured 4 dates, S1 missing at one of them
    for kind in ("S1", "S2"):
        for t in (2, 3):
            shutil.rmtree(raw / f"ROIs1868/119/{kind}/{t}")
    shutil.rmtree(raw / "ROIs1868/119/S1/1")


def _single(raw: Path) -> None:
    for kind in ("S1", "S2"):
        for t in (1, 2, 3):
            shutil.rmtree(raw / f"ROIs1868/119/{kind}/{t}")


def _no_clear(store: Path) -> None:  # every date cloudier than the clear threshold
    import zarr

    cover = zarr.open_group(str(store), mode="r+")["cloud_cover"]
    cover[...] = np.maximum(np.nan_to_num(cover[...], nan=1.0), 0.5).astype(np.float32)


STORES = {"without_s1": _without_s1, "short": _short, "single": _single, "no_clear": _no_clear}


@pytest.fixture(scope="module")
def stores(tiny_raw_master, tmp_path_factory) -> dict[str, Path]:
    from vcloud.data.prepare import prepare_roi

    folder = tmp_path_factory.mktemp("real")
    made = {}
    for name, change in STORES.items():
        raw = folder / f"raw_{name}"
        shutil.copytree(tiny_raw_master, raw)
        if name != "no_clear":
            change(raw)
        made[name] = folder / f"{name}.zarr"
        prepare_roi(raw=raw, roi=TINY_ROIS[0], out=made[name], times=TINY["times"], size=TINY["size"])
        if name == "no_clear":
            change(made[name])
    return made


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoints(tmp_path_factory.mktemp("ckpt"))


def _vcloud(args: list[str]) -> subprocess.CompletedProcess:
    src = str(Path(vcloud.__file__).parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    return subprocess.run(
        [sys.executable, "-m", "vcloud.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def _works_or_one_line(run: subprocess.CompletedProcess, command: str, store: Path) -> str | None:
    """None when it worked; else the one error line (checked: exit 2, names the store, no traceback)."""
    if run.returncode == 0:
        return None
    lines = run.stderr.strip().splitlines()
    errors = [line for line in lines if not LOG_LINE.match(line)]
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert len(errors) == 1 and errors[0].startswith(f"vcloud {command}: error: "), run.stderr
    assert str(store) in errors[0], errors[0]
    return errors[0]


@pytest.mark.slow  # over 10 s: docs/contributing.md, test tiers
@pytest.mark.parametrize("name", list(STORES))
def test_evaluate_and_predict_work_or_say_in_one_line_what_is_wrong(stores, ckpt, tmp_path, name):
    store = stores[name]
    evaluate = [
        "evaluate",
        "--stage",
        "1",
        "--stage1",
        str(ckpt[1]),
        "--config",
        str(ckpt["config"]),
        "--store",
        str(store),
        "--out",
        str(tmp_path / "eval.json"),
    ]
    error = _works_or_one_line(_vcloud(evaluate), "evaluate", store)
    if name in ("without_s1", "short"):  # S1 missing is data: the clear dates are targets all the same
        assert error is None
        assert (tmp_path / "eval.json").is_file()
    if name in ("single", "no_clear"):  # no date to use as ground truth: said, with what the store holds
        assert error is not None and "no clear date" in error
        assert ("2 locations with a single date" in error) == (name == "single")
    predicted = _vcloud(predict_args(store, tmp_path / "out", ckpt))
    assert _works_or_one_line(predicted, "predict", store) is None  # any cloudy date is reconstructed
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_a_store_without_s1_evaluates_the_same_clear_targets(stores, tiny_store):
    """The fixed protocol's targets are the clear S2 dates, whether S1 is there or not."""
    from vcloud.data.samples import CloudySamples

    with_s1 = CloudySamples(tiny_store, dates=2, kinds=("thin",))
    without = CloudySamples(stores["without_s1"], dates=2, kinds=("thin",))
    np.testing.assert_array_equal(with_s1.targets, without.targets)
    item = without[0]
    assert not item["s1_valid"].any() and not bool(item["target_s1_valid"]) and not item["x"][:, 13:15].any()
    assert with_s1[0]["s1_valid"].all()
