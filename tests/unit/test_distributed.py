"""Distributed set-up: launcher detection, SLURM hostlists, and a real 2-process gloo run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tests.system import unavailable
from vcloud.errors import ConfigError
from vcloud.train import distributed as d


def test_single_process_without_launcher_variables():
    assert d.detect({}) == d.DistEnv(0, 1, 0, "127.0.0.1", 29500, "single")
    assert d.detect({"PATH": "/usr/bin", "SLURM_JOB_ID": "7"}).source == "single"


def test_single_task_slurm_job_is_single():
    env = {
        "SLURM_NTASKS": "1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_JOB_ID": "42",
        "SLURM_NODELIST": "nid005001",
    }
    assert d.detect(env).source == "single"


def test_torchrun_variables():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "nid005001", "MASTER_PORT": "29600"}
    assert d.detect(env) == d.DistEnv(5, 8, 1, "nid005001", 29600, "torchrun")


def test_torchrun_variables_win_over_slurm():
    env = {
        "RANK": "3",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "3",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "1234",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NODELIST": "nid[1-2]",
        "SLURM_JOB_ID": "1",
    }
    assert d.detect(env) == d.DistEnv(3, 16, 3, "10.0.0.1", 1234, "torchrun")


def test_start_script_exporting_rank_from_slurm_uses_slurm_localid():
    env = {"RANK": "9", "WORLD_SIZE": "16", "SLURM_LOCALID": "1", "MASTER_ADDR": "nid1", "MASTER_PORT": "29500"}
    assert d.detect(env).local_rank == 1


def test_slurm_multi_node_first_host_and_port_from_job_id():
    env = {
        "SLURM_NTASKS": "16",
        "SLURM_PROCID": "9",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_ID": "8123456",
        "SLURM_JOB_NODELIST": "nid[005001-005003,005007],nid006000",
    }
    assert d.detect(env) == d.DistEnv(9, 16, 1, "nid005001", 29500 + 456, "slurm")


def test_slurm_master_addr_and_port_from_environment_win():
    env = {
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_JOB_ID": "1",
        "SLURM_NODELIST": "nid[005001-005002]",
        "MASTER_ADDR": "nid009999",
        "MASTER_PORT": "40000",
    }
    env_out = d.detect(env)
    assert (env_out.master_addr, env_out.master_port) == ("nid009999", 40000)


@pytest.mark.parametrize(
    ("hostlist", "expected"),
    [
        ("localhost", ["localhost"]),
        ("nid[005001-005003,005007],nid006000", ["nid005001", "nid005002", "nid005003", "nid005007", "nid006000"]),
        ("nid[08-10]", ["nid08", "nid09", "nid10"]),  # the lower bound's zero padding
        ("nid[9-11]", ["nid9", "nid10", "nid11"]),
        ("a1,b[2,4],c", ["a1", "b2", "b4", "c"]),
        ("r[1-2]n[08-09]-ib", ["r1n08-ib", "r1n09-ib", "r2n08-ib", "r2n09-ib"]),
    ],
)
def test_expand_hostlist(hostlist, expected):
    assert d.expand_hostlist(hostlist) == expected


@pytest.mark.parametrize("bad", ["", "nid[1-", "nid1]", "nid[]", "nid[3-1]", "nid[a]", "a,,b", "n[[1]]"])
def test_malformed_hostlist_raises(bad):
    with pytest.raises(ValueError):
        d.expand_hostlist(bad)


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"RANK": "0"}, "WORLD_SIZE"),
        ({"WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "LOCAL_RANK"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_PORT": "1"}, "MASTER_ADDR"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "99999"},
            "MASTER_PORT",
        ),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK"),
        ({"SLURM_NTASKS": "two"}, "SLURM_NTASKS"),
        ({"SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "1", "SLURM_NODELIST": "n1"}, "SLURM_PROCID"),
        ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_JOB_ID": "1", "SLURM_NODELIST": "n1"}, "SLURM_LOCALID"),
        ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "1"}, "MASTER_ADDR"),
        ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODELIST": "n1"}, "SLURM_JOB_ID"),
        (
            {
                "SLURM_NTASKS": "2",
                "SLURM_PROCID": "0",
                "SLURM_LOCALID": "0",
                "SLURM_JOB_ID": "1",
                "SLURM_NODELIST": "nid[1-",
            },
            "SLURM_NODELIST",
        ),
    ],
)
def test_missing_or_invalid_variables_name_the_variable(env, variable):
    with pytest.raises(ConfigError, match=f"environment variable {variable}:"):
        d.detect(env)


def test_single_process_helpers_need_no_process_group():
    import torch.distributed as dist

    env = d.detect({})
    d.init_process_group(env, device="cpu")
    assert not dist.is_initialized()
    assert d.is_main(env) and d.device_for(env) in ("cpu", "cuda")
    assert d.all_reduce_mean(2.5, "cpu") == 2.5
    assert d.any_rank(True, "cpu") is True and d.any_rank(False, "cpu") is False
    d.barrier()
    d.destroy()


def test_describe_names_rank_devices_and_affinity():
    line = d.describe(d.DistEnv(1, 2, 1, "nid1", 29500, "slurm"), "cpu", environ={"ROCR_VISIBLE_DEVICES": "0,1"})
    assert "rank 1/2 local 1 (slurm)" in line and "ROCR_VISIBLE_DEVICES=0,1" in line
    assert "CUDA_VISIBLE_DEVICES=-" in line and "\n" not in line
    if hasattr(os, "sched_getaffinity"):
        mask = int(d.cpu_affinity_mask(), 16)
        assert {c for c in range(mask.bit_length()) if mask >> c & 1} == os.sched_getaffinity(0)


# --- a real two-process run ---------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, torch
    from vcloud.train import distributed as d
    from vcloud.evaluation.metrics import MetricAccumulator

    env = d.detect()
    d.init_process_group(env, device="cpu", timeout_s=30)
    import torch.distributed as dist
    mean = d.all_reduce_mean(float(env.rank + 1), "cpu")
    acc = MetricAccumulator(names=("psnr",))
    acc.update({"psnr": torch.arange(env.rank + 1, dtype=torch.float32) + 10 * env.rank})
    means = acc.compute(reduce_fn=d.all_reduce_sum_fn("cpu"))
    stop_any = d.any_rank(env.rank == 1, "cpu")
    stop_none = d.any_rank(False, "cpu")
    d.barrier()
    print(json.dumps({"rank": env.rank, "world": env.world_size, "local": env.local_rank,
                      "addr": env.master_addr, "port": env.master_port, "source": env.source,
                      "dist_rank": dist.get_rank(), "dist_world": dist.get_world_size(),
                      "backend": dist.get_backend(), "mean": mean, "psnr": means["psnr"],
                      "main": d.is_main(env), "stop_any": stop_any, "stop_none": stop_none}))
    d.destroy()
    """
)


def _free_port_in_slurm_range() -> int:
    """A free port 29500 + k (k < 1000), so the port can come from SLURM_JOB_ID."""
    for port in range(29500 + os.getpid() % 500, 30500):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    unavailable("no free port in 29500..30499 on 127.0.0.1")  # skip, or fail under CI=true


def test_two_process_gloo_run_wired_from_slurm_variables():
    port = _free_port_in_slurm_range()
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in launcher}
    base.update(
        SLURM_NTASKS="2", SLURM_NODELIST="localhost", SLURM_JOB_ID=str(5_000_000 + port - 29500), OMP_NUM_THREADS="1"
    )
    if sys.platform.startswith("linux"):
        base["GLOO_SOCKET_IFNAME"] = "lo"  # stay on loopback whatever the host name resolves to
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD],
            env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    results = []
    deadline = time.monotonic() + 60
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            assert proc.returncode == 0, err[-2000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    except subprocess.TimeoutExpired:
        pytest.fail("two-process gloo run hung for 60 s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    for rank, result in enumerate(results):
        assert result["source"] == "slurm" and result["backend"] == "gloo"
        assert (result["rank"], result["dist_rank"], result["local"]) == (rank, rank, rank)
        assert result["world"] == result["dist_world"] == 2
        assert (result["addr"], result["port"]) == ("localhost", port)
        assert result["mean"] == 1.5  # (1 + 2) / 2
        assert result["psnr"] == pytest.approx((0 + 10 + 11) / 3)  # rank 0: [0], rank 1: [10, 11]
        assert result["main"] == (rank == 0)
        assert result["stop_any"] is True and result["stop_none"] is False  # rank 1 alone asked
