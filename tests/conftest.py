"""Shared fixtures: tiny raw trees made by the project's own synthetic generator; and the test
tiers: a plain `pytest` runs the fast tier, `--tier all` (or VCLOUD_TEST_TIER=all, or any `-m`)
the heavy ones too (docs/contributing.md lists what each needs and how long it takes)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from vcloud.data.layout import RoiId

TINY = {"patches": 2, "times": 4, "size": 32, "seed": 3}
TINY_ROIS = [RoiId("ROIs1868", 119), RoiId("ROIs1158", 119)]

# Markers of the heavy tiers (registered in pyproject.toml): left out of a plain `pytest`.
HEAVY = ("slurm", "browser", "kill", "image", "container", "slow")
# A test that uses one of these fixtures is in that tier without saying so itself.
TIER_OF_FIXTURE = {"slurm_cluster": "slurm", "chromium": "browser", "squashfs_tools": "image", "pipeline_run": "slow"}


def pytest_addoption(parser):
    parser.addoption(
        "--tier",
        choices=("fast", "all"),
        default=os.environ.get("VCLOUD_TEST_TIER", "fast"),
        help="fast (default): leave out the heavy tiers (" + ", ".join(HEAVY) + "); all: run every tier. "
        "A -m expression chooses by itself. Default from VCLOUD_TEST_TIER.",
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """pyproject's `-n auto`: a run of whole folders (a plain `pytest`) goes to xdist workers, one
    of named files or tests stays in one process (workers cost seconds to start). `-n N` or
    `-n 0` on the command line chooses by itself; `--pdb` is always one process."""
    named = [arg for arg in config.args if "::" in arg or not Path(arg.split("::")[0]).is_dir()]
    return 0 if named else None


def pytest_report_header(config):
    if config.getoption("--tier") == "fast" and not config.getoption("markexpr"):
        return f"tier: fast (heavy tiers {', '.join(HEAVY)} left out: --tier all or -m MARKER runs them)"
    return f"tier: {config.getoption('markexpr') or 'all'}"


# Under pytest-xdist's `--dist loadgroup` (a plain `pytest`, and .ci/run's run of every tier), the tests
# that share one of these fixtures run in one worker, so that it is made once: the cluster, the
# small pipeline run, the test SLURM's site cluster (tests/slurm/test_site_variants.py; its
# modules take turns on it, so one worker runs them instead of two waiting on each other). Any
# other test goes with its module (module fixtures, files shared between tests). The groups go
# out in this order, the rest after them.
SHARED_FIXTURES = ("slurm_cluster", "pipeline_run", "variants")


def _shared(item) -> int:
    """The index in SHARED_FIXTURES of the first one `item` uses; len(SHARED_FIXTURES): none."""
    return next((n for n, f in enumerate(SHARED_FIXTURES) if f in item.fixturenames), len(SHARED_FIXTURES))


@pytest.hookimpl(tryfirst=True)  # the markers added here must be there before -m selects
def pytest_collection_modifyitems(config, items):
    xdist = config.pluginmanager.hasplugin("xdist")
    for item in items:
        for fixture, marker in TIER_OF_FIXTURE.items():
            if fixture in item.fixturenames:
                item.add_marker(marker)
        if xdist:
            shared = _shared(item)
            group = SHARED_FIXTURES[shared] if shared < len(SHARED_FIXTURES) else item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # xdist hands the groups out in collection order: the longest (the cluster's, ~15 min,
        # mostly waiting) first, so that it is not the last thing left running.
        items.sort(key=_shared)
    if config.getoption("--tier") == "all" or config.getoption("markexpr"):
        return
    keep, heavy = [], []
    for item in items:
        (heavy if any(item.get_closest_marker(m) for m in HEAVY) else keep).append(item)
    if heavy:
        config.hook.pytest_deselected(items=heavy)
        items[:] = keep


@pytest.fixture(scope="session")
def _unreachable_scontrol(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("no-host-slurm")
    script = folder / "scontrol"
    script.write_text(
        '#!/bin/sh\necho "scontrol: no SLURM controller for the tests outside the slurm tier" >&2\nexit 1\n'
    )
    script.chmod(0o755)
    return folder


@pytest.fixture(autouse=True)
def _no_host_slurm(request, monkeypatch):
    """Outside the slurm tier, `scontrol` fails at once. The slurm executor plugin runs
    `scontrol show config` whenever snakemake starts; on a host with slurm-wlm installed and its
    controller down (this machine between cluster tests) that waits 9 s for every snakemake
    command, the same answer (no controller) that a host without SLURM gets at once."""
    if request.node.get_closest_marker("slurm"):
        return
    folder = request.getfixturevalue("_unreachable_scontrol")
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")


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


# A real Level-2A + SCL + S1 series as a user hands it over (../shared/realdata/README.md): read in
# place beside the clone, never copied into the repository.
REAL_LOCATION = Path(__file__).resolve().parents[2] / "shared/realdata/worldcereal/00002806639B424A"


@pytest.fixture(scope="session")
def real_location() -> Path:
    """The shared real series (unavailable: skip, or fail under CI=true, naming the folder)."""
    from tests.system import unavailable

    if not (REAL_LOCATION / "S2").is_dir():
        unavailable(f"needs the shared real series {REAL_LOCATION} (../shared/realdata beside the clone)")
    return REAL_LOCATION


@pytest.fixture(scope="session")
def real_store(real_location, tmp_path_factory) -> Path:
    """The real series prepared as `vcloud prepare` prepares a user's plain folder (10 bands, its SCL)."""
    from vcloud.bands import resolve_bands
    from vcloud.data.layout import RoiId
    from vcloud.data.prepare import prepare_roi
    from vcloud.data.s2files import S2Spec

    out = tmp_path_factory.mktemp("real") / "location.zarr"
    s2 = S2Spec(bands=resolve_bands("10m_20m", key="--bands"), level="L2A", boa_offset=0)
    prepare_roi(raw=real_location, roi=RoiId("ROIs9000", 1), out=out, times=118, size=64, s2=s2)
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
