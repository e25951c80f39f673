"""The cluster model on LUMI: rule resources, SLURM requests and launch lines, the generated profile,
the runtime environment (vcloud.runtime.cluster, vcloud.runtime.slurm)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lumi.helpers import require_stand_in, write_stand_in_image
from vcloud import environment as runtime_env
from vcloud.errors import ConfigError
from vcloud.runtime.cluster import Cluster, RuleResources
from vcloud.runtime.profile import load_workflow_config, render
from vcloud.runtime.site import load_site
from vcloud.runtime.slurm import launch_prefix, multinode_prefix, slurm_resources, uses_container

REPO = Path(__file__).resolve().parents[2]
LUMI_YAML = REPO / "config" / "lumi.yaml"
STAND_IN = REPO / "tests" / "lumi" / "bin"


@pytest.fixture(scope="module")
def lumi_config() -> dict:
    config = load_workflow_config(LUMI_YAML)
    config["cluster"]["account"] = "project_465000123"
    return config


@pytest.fixture(scope="module")
def cluster(lumi_config) -> Cluster:
    return Cluster.from_config(lumi_config)


def multinode(lumi_config, nodes=2) -> RuleResources:
    res = RuleResources.from_config(lumi_config, "train_stage1")
    return dataclasses.replace(res, nodes=nodes, gpus=8, partition="standard-g")


def test_default_config_has_no_cluster_and_runs_plain():
    config = load_workflow_config(REPO / "config" / "config.yaml")
    assert Cluster.from_config(config) is None
    res = RuleResources.from_config(config, "train_stage1")
    out = slurm_resources(res, None)
    assert out == {
        "runtime": res.runtime,
        "mem_mb": res.mem_mb,
        "slurm_partition": "small",
        "cpus_per_task": res.threads,
    }
    assert launch_prefix(res, None) == ""
    assert not uses_container(res, None)


def test_gpu_rule_resources_on_lumi(lumi_config, cluster):
    out = slurm_resources(RuleResources.from_config(lumi_config, "train_stage0"), cluster)
    assert out["slurm_partition"] == "small-g"
    assert out["slurm_account"] == "project_465000123"
    assert out["gpu"] == 1 and out["cpus_per_gpu"] == 7
    assert "cpus_per_task" not in out and "nodes" not in out
    # GPU rules start their own job step (the warning must not reach snakemake's jobstep).
    assert out["mpi"] == "srun" and out["slurm_extra"] == f"--signal=USR1@{cluster.signal_seconds}"
    assert "tasks_per_gpu" not in out and "tasks" not in out
    cpu = slurm_resources(RuleResources.from_config(lumi_config, "prepare_roi"), cluster)
    threads = lumi_config["resources"]["prepare_roi"]["threads"]
    assert cpu["slurm_partition"] == "small" and cpu["cpus_per_task"] == threads and "gpu" not in cpu


def test_multinode_resources_ask_for_every_gcd(lumi_config, cluster):
    out = slurm_resources(multinode(lumi_config), cluster)
    assert out["nodes"] == 2 and out["gpu"] == 16 and out["tasks_per_node"] == 8
    assert out["mpi"] == "srun"  # the batch step runs the rule's shell: it calls srun itself
    assert not uses_container(multinode(lumi_config), cluster)


def test_one_node_several_gcds_uses_torchrun_standalone_once(lumi_config, cluster):
    res = dataclasses.replace(RuleResources.from_config(lumi_config, "train_stage1"), gpus=8)
    srun = launch_prefix(res, cluster).split("; ")[-1]
    assert srun.startswith("srun --nodes=1 --ntasks-per-node=1 --gpus-per-node=8 --cpus-per-task=56 ")
    assert srun.endswith(
        " python3 -m vcloud.runtime.launch --ignore-usr1 "
        "torchrun --standalone --nnodes=1 --nproc-per-node=8 --no-python"
    )
    one = launch_prefix(dataclasses.replace(res, gpus=1), cluster).split("; ")[-1]
    assert one.startswith("srun --nodes=1 --ntasks-per-node=1 --gpus-per-node=1 --cpus-per-task=7 ")
    assert one.endswith(cluster.image) and "torchrun" not in one
    assert not uses_container(res, cluster)  # it runs singularity exec itself
    # Without a cluster (laptop with GPUs): plain torchrun, no srun.
    assert launch_prefix(res, None) == "torchrun --standalone --nnodes=1 --nproc-per-node=8 --no-python"


# The LUMI-G topology, written out independently of the masks (LUMI AI guide chapter 5, FIELD-FACTS.md):
# GCD g sits next to the L3 region (CCD) CCD_OF_GCD[g] of 8 cores, whose first core is reserved.
CCD_OF_GCD = (6, 7, 2, 3, 0, 1, 4, 5)


def test_cpu_masks_give_each_gcd_the_seven_usable_cores_next_to_it(cluster):
    """LUMI's masks are in its site file (config/sites/lumi.yaml), not in the code."""
    assert cluster.cpu_masks == tuple(load_site("lumi", REPO)["cpu_masks"])
    cores = [{bit for bit in range(64) if int(mask, 16) >> bit & 1} for mask in cluster.cpu_masks]
    assert cores == [set(range(8 * ccd + 1, 8 * ccd + 8)) for ccd in CCD_OF_GCD]
    assert sorted(set().union(*cores)) == [c for c in range(64) if c % 8]  # 56 usable, none shared


def test_multinode_line_geometry_masks_binds_image(lumi_config, cluster):
    line = launch_prefix(multinode(lumi_config), cluster)
    srun = line.split("; ")[-1]
    assert srun.startswith("srun --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 ")
    # Seed 003: GCD 0 next to cores 49-55 (fe000000000000), GCD 1 next to 57-63, ...
    assert f"--cpu-bind=mask_cpu:{','.join(cluster.cpu_masks)}" in srun
    for path in (
        "/opt/cray",
        "/pfs",
        "/scratch/project_465000123",
        "/projappl/project_465000123",
        "/flash/project_465000123",
    ):
        assert f"-B {path}" in srun
    assert "--rocm" not in line
    assert srun.endswith("singularity exec " + cluster.apptainer_args() + " " + cluster.image)
    assert cluster.image.endswith("pytorch_2.5.1_lumi_rocm6.2.4_flash-attn-3.0.0.post1.sif")
    # The squashfs environment of `vcloud image`, first on PATH inside the container.
    assert "-B /projappl/project_465000123/vcloud/vcloud-env.sqsh:/user-software:image-src=/" in srun
    assert "export SINGULARITYENV_PREPEND_PATH=/user-software/venv/bin" in line
    assert "SINGULARITY_CONTAINLIBS=/usr/lib64/libcxi.so.1,/opt/rocm/lib/librocm_smi64.so.7" in line


def test_multinode_without_cluster_is_refused(lumi_config):
    with pytest.raises(ConfigError, match="resources.train_stage1.nodes"):
        launch_prefix(multinode(lumi_config), None)


def _stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.container
def test_multinode_line_runs_master_from_squeue_not_nodelist(tmp_path, lumi_config, cluster):
    """The jobstep strips SLURM_NODELIST; the line must find rank 0's host from the job id."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir, "squeue", 'echo "nid[005001-005002]"\n')
    _stub(bin_dir, "scontrol", '[[ "$1 $2" == "show hostnames" ]] && printf "%s\\n" nid005001 nid005002\n')
    # srun: drop its options, run the rest once (one task is enough to see the wiring).
    _stub(bin_dir, "srun", 'while [[ "$1" == --* ]]; do echo "$1" >> "$SRUN_LOG"; shift; done\nexec "$@"\n')
    require_stand_in()
    image = write_stand_in_image(tmp_path)
    cl = dataclasses.replace(cluster, image=str(image), binds=(str(tmp_path),), env_image=None)
    line = multinode_prefix(multinode(lumi_config), cl)
    environ = {
        "PATH": f"{bin_dir}:{STAND_IN}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "1234567",
        "SRUN_LOG": str(tmp_path / "srun.log"),
        "VCLOUD_APPTAINER_LOG": str(tmp_path / "apptainer.jsonl"),
    }
    out = subprocess.run(
        ["bash", "-c", line + " bash -c 'echo \"$MASTER_ADDR:$MASTER_PORT\"'"],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "nid005001:30067"  # 29500 + 1234567 % 1000
    calls = [json.loads(x) for x in (tmp_path / "apptainer.jsonl").read_text().splitlines()]
    assert calls[0]["argv"][0] == "exec" and str(image) in calls[0]["argv"]
    assert calls[0]["containlibs"] == ",".join(cluster.containlibs)
    assert "--nodes=2" in (tmp_path / "srun.log").read_text()


def test_profile_is_generated_from_config_and_committed_copy_is_current(cluster):
    committed = (REPO / "profiles" / "lumi" / "config.yaml").read_text()
    shipped = Cluster.from_config(load_workflow_config(LUMI_YAML))
    assert committed == render(shipped), "profiles/lumi is stale: run `vcloud lumi-profile`"
    text = render(cluster)
    assert "executor: slurm" in text and "software-deployment-method: apptainer" in text
    assert "slurm-requeue: true" in text and "--rocm" not in text
    assert cluster.apptainer_args() in text and "SINGULARITY_CONTAINLIBS=" in text
    # `snakemake --profile lumi` from the repository root finds ./lumi.
    assert (REPO / "lumi").resolve() == (REPO / "profiles" / "lumi").resolve()


def test_stale_profile_check_fails(tmp_path):
    out = tmp_path / "config.yaml"
    out.write_text("executor: slurm\n")
    with pytest.raises(ConfigError, match="stale"):
        from vcloud.runtime.profile import write_profile

        write_profile(LUMI_YAML, out, check=True)


def test_pylibs_alternative_goes_on_pythonpath_and_path(cluster):
    cl = dataclasses.replace(cluster, pylibs="/projappl/project_465000123/pylibs", env_image=None)
    env = cl.container_env()
    assert env["SINGULARITYENV_PYTHONPATH"] == "/projappl/project_465000123/pylibs"
    assert env["SINGULARITYENV_PREPEND_PATH"] == "/projappl/project_465000123/pylibs/bin"


@pytest.mark.parametrize(
    "account,ok",
    [("project_465XXXXXX", False), ("project_465000123", True), ("465000123", False), ("<your project>", False)],
)
def test_account_placeholder(cluster, account, ok):
    problem = dataclasses.replace(cluster, account=account).account_problem()
    assert (problem is None) == ok
    if not ok:
        assert "cluster.account" in problem


def test_runtime_env_expands_node_and_user(tmp_path, monkeypatch):
    environ = {"SLURM_NODEID": "3"}
    cache = tmp_path / "{user}-miopen-{node}"
    done = runtime_env.apply({"MIOPEN_USER_DB_PATH": str(cache), "WANDB_MODE": "disabled"}, environ)
    user = runtime_env.expand("{user}", environ)
    assert environ["MIOPEN_USER_DB_PATH"] == str(tmp_path / f"{user}-miopen-3") == done["MIOPEN_USER_DB_PATH"]
    assert Path(environ["MIOPEN_USER_DB_PATH"]).is_dir()
    assert environ["WANDB_MODE"] == "disabled"


def test_runtime_env_pairs_are_checked():
    assert runtime_env.parse_pairs(["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    for bad in ("NOEQUALS", "=1", "1A=2", "A B=1"):
        with pytest.raises(ConfigError, match="--env"):
            runtime_env.parse_pairs([bad])


def test_train_sets_env_before_torch_is_imported(tmp_path):
    """PYTORCH_HIP_ALLOC_CONF is read once by the allocator: it must be set before torch."""
    code = (
        "import sys, os\n"
        "import vcloud.environment as e\n"
        "orig = e.apply\n"
        "def spy(settings, *a, **k):\n"
        "    print('torch imported before env:', 'torch' in sys.modules)\n"
        "    return orig(settings, *a, **k)\n"
        "e.apply = spy\n"
        "from vcloud.cli import main\n"
        "sys.exit(main(['train', '--stage', '0', '--config', 'missing.yaml', '--train', 'x',"
        " '--val', 'y', '--out', 'z', '--env', 'PYTORCH_HIP_ALLOC_CONF=expandable_segments:True']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert "torch imported before env: False" in out.stdout
    assert out.returncode == 2 and "missing.yaml" in out.stderr


def test_image_requirements_cover_the_package_dependencies():
    """containers/ installs every runtime dependency the CSC image lacks (not torch/numpy,
    which are the image's own, nor snakemake, which runs on the host)."""
    import re
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = {re.split(r"[<>=\[ ]", d)[0].lower() for d in deps}
    wanted -= {"torch", "numpy", "snakemake", "snakemake-executor-plugin-slurm"}
    lines = (REPO / "containers" / "requirements-image.txt").read_text().splitlines()
    listed = {re.split(r"[<>=\[ ]", x)[0].lower() for x in lines if x.strip() and not x.startswith("#")}
    assert wanted <= listed, sorted(wanted - listed)
    assert "torch" not in listed
    definition = (REPO / "containers" / "vcloud.def").read_text()
    assert "pytorch_2.5.1_lumi_rocm6.2.4_flash-attn-3.0.0.post1.sif" in definition
    assert "--no-deps" in definition and "--rocm" not in definition


class _Res(dict):
    """What the plugin reads from job.resources: attribute and .get access."""

    __getattr__ = dict.__getitem__


def sbatch_line(out: dict, threads: int) -> str:
    """The installed SLURM plugin's own sbatch line for a rule with these resources."""
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    job = SimpleNamespace(resources=_Res(out), threads=threads)
    params = {
        "run_uuid": "vcloud_x",
        "slurm_logfile": "log",
        "comment_str": "rule_x",
        "account": f"-A {out['slurm_account']}",
        "partition": f"-p {out['slurm_partition']}",
        "workdir": None,
    }
    return get_submit_command(job, params) + set_gres_string(job)  # as the plugin's run_job


def test_sbatch_geometry_of_the_8_gcd_and_multinode_rules(lumi_config, cluster):
    """FIELD-FACTS: the plugin before 2.7.1 added --ntasks-per-gpu=1 (torchrun once per GCD)."""
    from vcloud.runtime.profile import PLUGIN_FLOOR, installed_version

    assert installed_version("snakemake-executor-plugin-slurm") >= PLUGIN_FLOOR
    one = RuleResources.from_config(lumi_config, "train_stage1").with_overrides({"gpu": 8})
    line = sbatch_line(slurm_resources(one, cluster), one.threads)
    assert "--ntasks-per-gpu" not in line and "--gpus=8" in line and "--cpus-per-gpu=7" in line
    assert f"--mem {8 * one.mem_mb_per_gpu}" in line and "--signal=USR1@300" in line
    step = launch_prefix(one, cluster).split("; ")[-1]
    assert step.count("torchrun") == 1 and "--ntasks-per-node=1 " in step and "--nproc-per-node=8" in step
    multi = multinode(lumi_config, nodes=4)
    line = sbatch_line(slurm_resources(multi, cluster), multi.threads)
    assert "--ntasks-per-gpu" not in line and "--nodes=4" in line and "--ntasks-per-node=8" in line
    assert "--gpus=32" in line
    step = launch_prefix(multi, cluster).split("; ")[-1]
    assert "--nodes=4 --ntasks-per-node=8 --gpus-per-node=8" in step and "torchrun" not in step


def test_set_resources_refuses_geometry_and_follows_gpu(lumi_config):
    res = RuleResources.from_config(lumi_config, "train_stage1")
    assert res.with_overrides({"gpu": "8"}).gpus == 8
    for bad, match in (
        ({"tasks": 8}, "train_stage1:tasks: vcloud sets the task geometry"),
        ({"gpu": 12, "nodes": 8}, "gpu=12: not a multiple of the 8 nodes"),
        ({"gpu": "many"}, "gpu='many': expected a whole number"),
        ({"mem": "60G"}, "train_stage1:mem: not followed"),
    ):
        with pytest.raises(ConfigError, match=match):
            res.with_overrides(bad)


def test_launch_wrapper_ignores_usr1_across_exec(tmp_path):
    """torchrun started through vcloud.runtime.launch survives SIGUSR1 (an ignored signal
    stays ignored across exec); without it the same child dies of it."""
    import signal

    child = [
        sys.executable,
        "-c",
        "import os, signal, time; os.kill(os.getpid(), signal.SIGUSR1); time.sleep(0.2); print('alive')",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "vcloud.runtime.launch", "--ignore-usr1", *child],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert out.returncode == 0 and out.stdout.strip() == "alive"
    bare = subprocess.run(child, capture_output=True, text=True)
    assert bare.returncode == -signal.SIGUSR1


def test_epoch_time_is_measured_from_metrics_and_retries_cover_it():
    from vcloud.runtime.cluster import measured_epoch_minutes, retries_needed

    rows = [json.dumps({"epoch": e, "wall_time": 1000.0 + 600 * e, "epoch_s": 500.0}) for e in range(4)]
    assert measured_epoch_minutes(rows + ['{"epoch": 4, "wall']) == 10.0  # torn last line ignored
    assert measured_epoch_minutes(rows[:1]) == 500 / 60
    assert measured_epoch_minutes([]) is None
    assert (
        retries_needed(epochs=100, epoch_minutes=27, runtime=4320, signal_seconds=300, restart_minutes=10, spare=2) == 2
    )  # one job holds the stage
    assert (
        retries_needed(epochs=100, epoch_minutes=27, runtime=180, signal_seconds=300, restart_minutes=10, spare=2)
        == 17 - 1 + 2
    )  # 2700 min / 165 min
    with pytest.raises(ConfigError, match="no training time"):
        retries_needed(epochs=1, epoch_minutes=1, runtime=10, signal_seconds=300, restart_minutes=10, spare=0)


def test_evaluate_survives_the_wall_time_warning(tmp_path):
    """SIGUSR1 during `vcloud evaluate` is noted, not fatal (it has no state to save)."""
    code = (
        "import os, signal, sys\n"
        "import vcloud.cli as cli\n"
        "def fake(args):\n"
        "    import signal as s\n"
        "    os.kill(os.getpid(), s.SIGUSR1)\n"
        "    print('still running')\n"
        "import vcloud.evaluation.evaluate as ev\n"
        "ev.evaluate = lambda **kw: fake(None)\n"
        "sys.exit(cli.main(['evaluate', '--stage', '0', '--store', 'x', '--out', 'y', '--config', 'z']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert out.returncode == 0 and out.stdout.strip() == "still running", out.stderr
    assert "SIGUSR1 (the wall time ends soon)" in out.stderr


def test_cpu_budget_reads_the_rules_threads_else_the_bound_cpus():
    assert runtime_env.cpu_budget({"OMP_NUM_THREADS": "3"}) == 3
    assert runtime_env.cpu_budget({}) == len(os.sched_getaffinity(0))
    assert runtime_env.cpu_budget({"OMP_NUM_THREADS": "0"}) == len(os.sched_getaffinity(0))
    with pytest.raises(ConfigError, match="OMP_NUM_THREADS='two'"):
        runtime_env.cpu_budget({"OMP_NUM_THREADS": "two"})


def test_the_step_gets_the_cores_its_dataloader_workers_leave():
    assert runtime_env.step_threads(1, {"OMP_NUM_THREADS": "2"}) == 1  # the default: 2 cores, 1 worker
    assert runtime_env.step_threads(0, {"OMP_NUM_THREADS": "2"}) == 2
    assert runtime_env.step_threads(7, {"OMP_NUM_THREADS": "7"}) == 1  # never none
    assert runtime_env.step_threads(2, {"OMP_NUM_THREADS": "8"}) == 6


def test_a_lumi_ai_factory_image_is_one_setting(lumi_config):
    """cluster.image naming an AI Factory image: every container call, the profile and the
    environment build follow it; nothing else names the CSC image."""
    from vcloud.runtime import image as env_image

    aif = "/appl/local/laifs/containers/lumi-multitorch-full-u24r70f21m50t210-20260415_130625/lumi-multitorch.sif"
    config = dataclasses.replace(Cluster.from_config(lumi_config), image=aif)
    line = launch_prefix(RuleResources.from_config(lumi_config, "train_stage1"), config)
    assert f" {aif}" in line and "pytorch_2.5.1" not in line
    assert env_image.probe_command(base=aif)[:3] == ["singularity", "exec", aif]
    steps = env_image.build_commands(base=aif, repo=REPO, build=Path("/tmp/b"), out=Path("/tmp/o.sqsh"))
    assert all(aif in step for step in steps[:-1])


# --- the model carries no site's facts: each comes from the site's file ----------------------

SITE_FACTS = (
    "title",
    "account_pattern",
    "account_example",
    "vendor",
    "gpu_request",
    "runner",
    "transport",
    "billing_formula",
    "billing_unit",
    "billing_source",
)


def test_the_sites_own_facts_have_no_default_in_the_model():
    fields = {f.name: f for f in dataclasses.fields(Cluster)}
    assert all(fields[name].default is dataclasses.MISSING for name in SITE_FACTS)
    assert fields["cpu_masks"].default == () and fields["billing_slices"].default_factory() == {}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.pop("vendor"), "cluster.vendor: missing; the site's file says it (config/sites/lumi.yaml)"),
        (lambda c: c["billing"].update(source=""), "cluster.billing.source: missing"),
        (lambda c: c["billing"].pop("slices"), "cluster.billing.slices: the lumi formula needs the site's slice sizes"),
    ],
)
def test_a_missing_site_fact_is_refused_in_one_line_naming_the_key(lumi_config, change, message):
    config = copy.deepcopy(lumi_config)
    change(config["cluster"])
    with pytest.raises(ConfigError) as err:
        Cluster.from_config(config)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_lumis_bill_comes_from_the_slices_of_its_site_file(lumi_config, cluster):
    from vcloud.runtime.billing import billing, formula_text

    slices = load_site("lumi", REPO)["billing"]["slices"]
    assert cluster.billing_slices == slices and slices["cores_per_gcd"] == 8
    train = RuleResources.from_config(lumi_config, "train_stage1")  # one GCD, 7 cores, 60 GB
    assert billing(train, cluster.partitions["small-g"], cluster).per_hour == 0.5
    assert billing(dataclasses.replace(train, gpus=8), cluster.partitions["standard-g"], cluster).per_hour == 4.0
    assert formula_text(cluster) == (
        "LUMI user guide, docs/runjobs/lumi_env/billing.md; GPU-h: 0.5 per GCD-hour on small-g/dev-g, "
        "4 per node-hour on standard-g; core-h on small: max(cores, memory / 2 GB)"
    )
    doubled = dataclasses.replace(cluster, billing_slices={**slices, "cores_per_gcd": 4})  # another site's numbers
    assert billing(dataclasses.replace(train, cpus_per_gpu=8), cluster.partitions["small-g"], doubled).per_hour == 1.0


def test_a_site_without_cpu_masks_lets_slurm_place_each_ranks_cores():
    config = load_workflow_config(REPO / "config" / "saga.yaml")
    config["cluster"]["account"] = "nn1234k"
    saga = Cluster.from_config(config)
    assert saga.cpu_masks == ()
    res = dataclasses.replace(RuleResources.from_config(config, "train_stage1"), nodes=2, gpus=4)
    srun = launch_prefix(res, saga).split("; ")[-1]
    assert f"--nodes=2 --ntasks-per-node=4 --gpus-per-node=4 --cpus-per-task={res.cpus_per_gpu} " in srun
    assert "mask_cpu" not in srun
