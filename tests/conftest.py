"""Shared fixtures: tiny raw trees made by the project's own synthetic generator."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vcloud.data.layout import RoiId

TINY = {"patches": 2, "times": 4, "size": 32, "seed": 3}
TINY_ROIS = [RoiId("ROIs1868", 119), RoiId("ROIs1158", 119)]


@pytest.fixture(scope="session")
def tiny_raw_master(tmp_path_factory) -> Path:
    from vcloud.data.synthetic import write_raw_tree

    root = tmp_path_factory.mktemp("raw") / "sen12mscrts"
    write_raw_tree(root, rois=TINY_ROIS, **TINY)
    return root


@pytest.fixture
def tiny_raw(tiny_raw_master, tmp_path) -> Path:
    """A private copy of the tiny raw tree that a test may damage."""
    copy = tmp_path / "raw"
    shutil.copytree(tiny_raw_master, copy)
    return copy


@pytest.fixture(scope="session")
def tiny_store(tiny_raw_master, tmp_path_factory) -> Path:
    """A prepared store of one tiny ROI (2 locations x 4 dates x 32 px)."""
    from vcloud.data.prepare import prepare_roi

    out = tmp_path_factory.mktemp("store") / "ROIs1868_119.zarr"
    prepare_roi(raw=tiny_raw_master, roi=TINY_ROIS[0], out=out, times=TINY["times"], size=TINY["size"])
    return out


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one thread is faster, and immune to a busy machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def small():
    """The small (CPU default) model set."""
    from vcloud.config import load_model_config

    return load_model_config(Path(__file__).parents[1] / "config/models/small.yaml")


@pytest.fixture(scope="session")
def pipeline_run(tmp_path_factory):
    """One real run of the whole workflow on the small config (tiny models), shared by the
    workflow tests and the browser tests: (work dir, dry-run process, real-run process)."""
    import yaml

    from tests.workflow.snakemake_run import SMALL, run

    work = tmp_path_factory.mktemp("wf")
    (work / "small.yaml").write_text(yaml.safe_dump(SMALL))
    dry = run(["-n", "--configfile", "small.yaml", "-d", str(work)], cwd=work)
    real = run(["--cores", "2", "--configfile", "small.yaml", "-d", str(work)], cwd=work)
    return work, dry, real
