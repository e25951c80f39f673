"""Sites: every fact of a cluster in config/sites/<site>.yaml, beneath the run's cluster
section; the GPU request form, --nv, images per architecture, billing formulas and the
pre-flight refusals follow the site file (issue: every cluster the team uses)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from vcloud.config import load_model_config
from vcloud.errors import ConfigError
from vcloud.runtime.billing import billing
from vcloud.runtime.cluster import Cluster, RuleResources
from vcloud.runtime.doctor import Report, check_memory, check_precision, stage_gpus
from vcloud.runtime.profile import load_workflow_config, render
from vcloud.runtime.site import apply_site, load_site, site_names
from vcloud.runtime.slurm import launch_prefix, slurm_resources, uses_container

REPO = Path(__file__).resolve().parents[2]
SITES = ("betzy", "eagle", "lumi", "olivia", "saga")


def site_config(site: str, **cluster) -> dict:
    config = load_workflow_config(REPO / "config" / f"{site}.yaml")
    config["cluster"]["account"] = load_site(site, REPO)["account_example"]
    config["cluster"].update(cluster)
    return config


def resources(config: dict, rule: str) -> RuleResources:
    return RuleResources.from_config(config, rule)


def test_every_shipped_site_loads_and_its_run_file_names_it():
    assert site_names(REPO) == list(SITES)
    for site in SITES:
        config = site_config(site)
        cluster = Cluster.from_config(config)
        assert cluster.name == site and cluster.account_problem() is None
        gpu = cluster.partitions[cluster.placement["gpu"]]
        assert gpu.gpu is not None and gpu.gpus_per_node > 0, site
        assert resources(config, "train_stage1").partition == cluster.placement["gpu"]
        assert resources(config, "prepare_roi").partition == cluster.placement["cpu"]


def test_the_placeholder_account_of_a_run_file_is_refused_with_the_site_pattern():
    cluster = Cluster.from_config(load_workflow_config(REPO / "config" / "saga.yaml"))
    assert "placeholder; set your Saga project (e.g. nn1234k) in config/saga.yaml" in cluster.account_problem()
    wrong = Cluster.from_config(site_config("saga", account="project_465000123"))
    assert "is not a Saga project (like nn1234k" in wrong.account_problem()


def test_nvidia_gpu_steps_run_with_nv_and_cpu_rules_without():
    config = site_config("saga")
    cluster = Cluster.from_config(config)
    train = resources(config, "train_stage1")
    line = launch_prefix(train, cluster)
    assert " singularity exec --nv -B /cluster " in line and "--gpus-per-node=1" in line
    assert "/cluster/projects/nn1234k/vcloud/pytorch.sif" in line
    assert not uses_container(train, cluster)
    cpu = resources(config, "prepare_roi")
    assert uses_container(cpu, cluster) and launch_prefix(cpu, cluster) == ""
    assert "--nv" not in render(cluster)  # never in snakemake's global apptainer arguments
    lumi = Cluster.from_config(site_config("lumi"))
    assert "--nv" not in launch_prefix(resources(site_config("lumi"), "train_stage1"), lumi)


def test_a_gres_site_asks_for_typed_gpus_on_sbatch_and_srun_alike():
    config = site_config("eagle")
    cluster = Cluster.from_config(config)
    train = resources(config, "train_stage1")
    sbatch = slurm_resources(train, cluster)
    assert sbatch["gres"] == "gpu:h100:1" and "gpu" not in sbatch and "cpus_per_gpu" not in sbatch
    # one core per task, as many tasks as the cores the step takes: exactly gpus x cpus_per_gpu
    assert sbatch["cpus_per_task"] == 1 and sbatch["tasks_per_node"] == train.gpus * train.cpus_per_gpu
    line = launch_prefix(train, cluster)
    assert "--gres=gpu:h100:1" in line and "--gpus-per-node" not in line and "exec --nv" in line
    gpus = slurm_resources(resources(site_config("saga"), "train_stage1"), Cluster.from_config(site_config("saga")))
    assert gpus["gpu"] == 1 and "gres" not in gpus


def test_olivia_runs_gpu_steps_in_its_arm_image_and_sets_the_ll128_guard():
    config = site_config("olivia")
    cluster = Cluster.from_config(config)
    line = launch_prefix(resources(config, "train_stage1"), cluster)
    assert "apptainer exec --nv" in line and "pytorch-aarch64.sif" in line
    assert cluster.image_for("normal").endswith("pytorch-x86_64.sif")
    assert config["runtime_env"]["NCCL_PROTO"] == "^LL128" and config["runtime_env"]["NCCL_CROSS_NIC"] == "1"
    assert "MIOPEN_USER_DB_PATH" not in config["runtime_env"]  # LUMI's ROCm settings stay LUMI's


@pytest.mark.parametrize(
    ("site", "partition", "per_hour", "unit"),
    [
        ("saga", "a100", 8.0, "BU-h"),  # max(6 CPUs, 58.6 GiB x 0.032, 1 GPU x 8)
        ("saga", "accel", 6.0, "BU-h"),  # max(6, 58.6 x 0.0659 = 3.86, 1 x 6)
        ("betzy", "accel", 16.0, "BU-h"),  # max(16 CPUs, 58.6 x 0.1294 = 7.58, 1 x 16)
        ("olivia", "accel", 1.0, "GPU-h"),  # the GPU-hour quota: GPUs x hours
        ("eagle", "proxima", 1.0, "GPU-h"),
        ("lumi", "small-g", 0.5, "GPU-h"),  # LUMI's slices, unchanged
    ],
)
def test_each_site_bills_a_one_gpu_stage_job_by_its_own_formula(site, partition, per_hour, unit):
    config = site_config(site)
    config["resources"]["train_stage1"]["partition"] = partition
    cluster = Cluster.from_config(config)
    bill = billing(resources(config, "train_stage1"), cluster.partitions[partition], cluster)
    assert (bill.per_hour, bill.unit) == (per_hour, unit), bill.formula
    assert ("unverified" in bill.formula) == (site == "eagle")


def test_bf16_on_a_pre_ampere_gpu_is_refused_before_submission():
    config = site_config("saga")
    for rule in config["resources"]:
        if rule.startswith(("train_stage", "evaluate_stage")):
            config["resources"][rule]["partition"] = "accel"
    cluster = Cluster.from_config(config)
    report = Report()
    check_precision(load_model_config(REPO / "config/models/full.yaml"), cluster, stage_gpus(config, cluster), report)
    assert len(report.errors) == 1
    assert "stage1.train.bf16" in report.errors[0] and "P100 (compute capability 6)" in report.errors[0]
    assert "set train.bf16: false" in report.errors[0]
    report = Report()
    small = load_model_config(REPO / "config/models/small.yaml")  # bf16 off
    check_precision(small, cluster, stage_gpus(config, cluster), report)
    assert report.errors == []


def test_a_model_that_does_not_fit_the_partition_gpu_is_refused():
    cluster = Cluster.from_config(site_config("saga"))
    model = load_model_config(REPO / "config/models/full.yaml")
    report = Report()
    check_memory(model, cluster, report, estimate={"cfdt_gb_configured": 30.0}, partitions=["accel", "a100"])
    assert (
        len(report.errors) == 1
        and "30.0 GB (36.0 GB with the 20% margin), more than the 16 GB of one P100 on accel" in report.errors[0]
    )


# --- bad site files: one line naming the file and the key ------------------------------------


def site_root(tmp_path: Path, name: str, facts: dict) -> Path:
    """A repository root holding the schema and one site file."""
    (tmp_path / "workflow" / "schemas").mkdir(parents=True)
    shutil.copy(REPO / "workflow/schemas/config.schema.yaml", tmp_path / "workflow/schemas")
    (tmp_path / "config" / "sites").mkdir(parents=True)
    (tmp_path / "config" / "sites" / f"{name}.yaml").write_text(yaml.safe_dump(facts))
    return tmp_path


def saga_facts() -> dict:
    return yaml.safe_load((REPO / "config/sites/saga.yaml").read_text())


def test_an_unknown_site_names_the_known_ones():
    with pytest.raises(
        ConfigError, match=r"cluster.site: 'nowhere': no config/sites/nowhere.yaml \(sites: betzy, eagle"
    ):
        apply_site({"cluster": {"site": "nowhere"}}, REPO)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.pop("partitions"), "missing key partitions"),
        (lambda f: f["partitions"]["a100"]["gpu"].update(memory_gb="lots"), "key partitions.a100.gpu.memory_gb"),
        (lambda f: f.update(gpu_request="gpu"), "key gpu_request"),
        (lambda f: f.update(account="nn1234k"), "account is the user's, not the site's"),
        (lambda f: f["partitions"]["a100"].update(gpus=4), "unknown key partitions.a100.gpus"),
        (lambda f: f["billing"].update(formula="lumi", slices={"cores_per_gcd": 8}), "billing.slices"),
    ],
)
def test_a_bad_site_file_is_refused_naming_file_and_key(tmp_path, change, message):
    facts = saga_facts()
    facts["name"] = "testsite"
    change(facts)
    root = site_root(tmp_path, "testsite", facts)
    with pytest.raises(ConfigError) as err:
        load_site("testsite", root)
    assert str(err.value).startswith(str(root / "config/sites/testsite.yaml")) and message in str(err.value)


def test_the_run_section_lies_over_the_site_facts(tmp_path):
    facts = saga_facts()
    facts["name"] = "testsite"
    root = site_root(tmp_path, "testsite", facts)
    config = {"cluster": {"site": "testsite", "account": "nn1234k", "jobs": 4}, "runtime_env": {"NCCL_DEBUG": "INFO"}}
    apply_site(config, root)
    assert config["cluster"]["jobs"] == 4 and config["cluster"]["partitions"]["a100"]["gpus_per_node"] == 4
    assert config["runtime_env"]["NCCL_DEBUG"] == "INFO" and config["runtime_env"]["WANDB_MODE"] == "disabled"
    assert "env" not in config["cluster"]


def test_a_raw_path_that_cannot_be_read_is_named_in_the_bill(tmp_path):
    from vcloud.runtime.bill import rois_to_prepare

    raw = tmp_path / "SEN12MS-CR-TS"
    raw.write_text("not an archive, not a folder")
    config = site_config("saga")
    config["data"]["raw"] = str(raw)
    rois, why = rois_to_prepare(config)
    assert len(rois) == 53 and "data.raw could not be read" in why and "not counted there" in why
    config["data"]["raw"] = str(tmp_path / "absent")
    assert "data.raw not there yet" in rois_to_prepare(config)[1]


def test_every_site_epoch_estimate_is_below_its_partition_wall_time():
    for site in SITES:
        config = site_config(site)
        for n in range(4):
            res = resources(config, f"train_stage{n}")
            assert res.epoch_minutes and res.epoch_minutes < res.runtime, (site, n)


# --- the transport check reads NCCL's own log -----------------------------------------------

NCCL_LOGS = Path(__file__).parent / "data" / "nccl"


@pytest.mark.parametrize(
    ("expect", "log", "problem"),
    [
        ("ib", "ib.log", None),
        ("ib", "socket.log", "NCCL fell back to TCP sockets (Using network Socket), not ib"),
        ("ib", "cxi.log", "no InfiniBand line"),
        ("cxi", "cxi.log", None),
        ("cxi", "socket.log", "no aws-ofi-rccl and no cxi line"),
        ("cxi", "ib.log", "no aws-ofi-rccl and no cxi line"),
        ("unverified", "ib.log", None),
        ("unverified", "cxi.log", None),
        ("unverified", "socket.log", "NCCL fell back to TCP sockets"),
    ],
)
def test_the_transport_check_tells_ib_cxi_and_the_socket_fallback(expect, log, problem):
    from vcloud.runtime.transport import transport_problems

    found = transport_problems({log: (NCCL_LOGS / log).read_text()}, expect=expect)
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(f"{log}: ") and problem in found[0]


# --- the trainer repeats the capability check on the device ----------------------------------


def test_the_trainer_refuses_bf16_on_a_pre_ampere_device():
    from vcloud.environment import check_bf16

    with pytest.raises(
        ConfigError, match=r"full.yaml: stage1.train.bf16: Tesla P100-PCIE-16GB \(compute capability 6.0\)"
    ):
        check_bf16(True, "cuda:0", where="full.yaml: stage1.train.bf16", capability=(6, 0), name="Tesla P100-PCIE-16GB")
    check_bf16(True, "cuda:0", where="x", capability=(8, 0), name="A100")  # Ampere: allowed
    check_bf16(False, "cuda:0", where="x", capability=(6, 0), name="P100")  # off: nothing to refuse
    check_bf16(True, "cpu", where="x")  # the CPU runs bf16 autocast where asked


def test_rank_zero_logs_the_vendor_tool_and_says_when_it_is_missing(caplog, tmp_path, monkeypatch):
    import logging

    from vcloud.environment import log_gpu_state

    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho 'NVIDIA-SMI 550.54  GPU 0: NVIDIA H100'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="vcloud.environment"):
        log_gpu_state(0, tool="nvidia-smi")
        log_gpu_state(0, tool="rocm-smi")
        log_gpu_state(1, tool="nvidia-smi")  # only local rank 0
    text = caplog.text
    assert text.count("NVIDIA-SMI 550.54") == 1 and "rocm-smi: not on PATH" in text


# --- every site rehearses as LUMI does ---------------------------------------------------------


@pytest.mark.parametrize(
    ("site", "partition", "qos", "transport_gpus", "unit"),
    [
        ("lumi", "dev-g", None, 8, "GPU-h"),
        ("saga", "a100", "devel", 4, "BU-h"),
        ("betzy", "accel", None, 4, "BU-h"),  # devel gives whole nodes only: not for 1-GPU jobs
        ("olivia", "accel", "devel", 4, "GPU-h"),
        ("eagle", "proxima", None, 4, "GPU-h"),
    ],
)
def test_each_site_rehearses_on_its_test_partition_priced_by_its_formula(
    site, partition, qos, transport_gpus, unit, monkeypatch, tmp_path
):
    from vcloud.runtime.doctor import preflight

    monkeypatch.setenv("APPTAINER_CACHEDIR", str(tmp_path / "cache"))  # Eagle's home is small
    config = load_workflow_config(REPO / "config" / f"{site}.yaml", REPO / "config" / "rehearsal.yaml")
    config["cluster"]["account"] = load_site(site, REPO)["account_example"]
    for n in range(4):
        train, evaluate = resources(config, f"train_stage{n}"), resources(config, f"evaluate_stage{n}")
        assert (train.partition, train.qos, train.gpus, train.runtime) == (partition, qos, 1, 12)
        assert train.epoch_minutes == 4  # the run file's full-run estimate does not apply
        assert train.rehearse_warning == (150 if n == 1 else None)
        assert (evaluate.partition, evaluate.qos, evaluate.runtime) == (partition, qos, 6)
    transport = resources(config, "rehearse_transport")
    assert (transport.partition, transport.gpus, transport.qos) == (partition, transport_gpus, qos)
    cluster = Cluster.from_config(config)
    model = load_model_config(REPO / "config/models/rehearsal.yaml")
    inputs = {f"train_stage{n}": {"train", "val", "wind_cache"} for n in range(4)}
    report = preflight(
        config,
        model,
        apptainer_args=cluster.apptainer_args(),
        precommand=cluster.precommand(),
        train_inputs=inputs,
        memory=False,
    )
    assert report.errors == [], report.errors
    total = next(line for line in report.lines if line.lstrip().startswith("total "))
    expected = float(total.split()[1])
    assert total.split()[2] == unit and 0 < expected < (5 if unit == "GPU-h" else 100), total


def test_a_rehearsal_over_its_qos_limits_is_refused(tmp_path):
    from vcloud.runtime.doctor import Report, check_site

    longer = tmp_path / "longer.yaml"
    longer.write_text(yaml.safe_dump({"rehearsal": {"train_minutes": 180}}))  # devel: 2 h at most
    config = load_workflow_config(REPO / "config" / "saga.yaml", REPO / "config" / "rehearsal.yaml", longer)
    config["cluster"]["account"] = "nn1234k"
    config["resources"]["evaluate_stage0"]["qos"] = "debug"
    report = Report()
    check_site(config, Cluster.from_config(config), report)
    assert "resources.train_stage1.runtime: 180 min is above the devel QOS limit of 120 min" in report.errors
    assert any(e.startswith("resources.evaluate_stage0.qos: 'debug' is not a QOS of Saga") for e in report.errors)


def test_caches_under_a_small_home_are_refused(tmp_path):
    from vcloud.runtime.site_checks import check_home_caches

    eagle = Cluster.from_config(site_config("eagle"))
    home = str(tmp_path / "home")
    assert "APPTAINER_CACHEDIR unset" in check_home_caches(eagle, {}, environ={"HOME": home})[0]
    found = check_home_caches(eagle, {}, environ={"HOME": home, "SINGULARITY_CACHEDIR": f"{home}/.cache"})
    assert found and found[0].startswith(f"SINGULARITY_CACHEDIR={home}/.cache: under $HOME, which holds 1 GB on Eagle")
    project = {"HOME": home, "APPTAINER_CACHEDIR": str(tmp_path / "grant" / "cache")}
    assert check_home_caches(eagle, {}, environ=project) == []
    assert (
        "runtime_env.TORCH_HOME: ~/.torch is under $HOME"
        in check_home_caches(eagle, {"TORCH_HOME": "~/.torch"}, environ=project)[0]
    )
    saga = Cluster.from_config(site_config("saga"))  # 20 GiB: caches may stay home
    assert check_home_caches(saga, {}, environ={"HOME": home}) == []


def test_results_in_a_purged_work_area_are_refused_and_data_there_warned(tmp_path):
    from vcloud.runtime.site_checks import check_purge

    config = site_config("saga")
    cluster = Cluster.from_config(config)
    work = tmp_path / "work"
    quotas = dict(cluster.quotas)
    quotas["work"] = {**quotas["work"], "path": str(work)}
    cluster = Cluster.from_config({**config, "cluster": {**config["cluster"], "quotas": quotas}})
    config["paths"]["results"] = str(work / "results")
    config["paths"]["prepared"] = str(work / "prepared")
    errors, warnings = check_purge(config, cluster, tmp_path, run_hours=24 * 30)
    assert len(errors) == 1 and errors[0].startswith(f"paths.results: {work}/results lies in Saga's work area")
    assert "deleted after 21 days" in errors[0]
    assert len(warnings) == 1 and "expected to take 30.0 days (longer than that)" in warnings[0]
    config["paths"]["results"] = str(tmp_path / "project" / "results")
    errors, warnings = check_purge(config, cluster, tmp_path, run_hours=24 * 5)
    assert errors == [] and "5.0 days (within that)" in warnings[0]


def test_an_image_of_another_architecture_is_refused(tmp_path):
    from vcloud.runtime.site_checks import check_images, image_arch

    sif = bytearray(b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0") + b"SIF_MAGIC\0" + b"01\0" + b"02\0")
    (tmp_path / "x86.sif").write_bytes(bytes(sif).ljust(4096, b"\0"))
    sif[45:47] = b"04"
    (tmp_path / "arm.sif").write_bytes(bytes(sif).ljust(4096, b"\0"))
    (tmp_path / "standin.sif").write_text("stand-in image\narch aarch64\n")
    assert [image_arch(tmp_path / n) for n in ("x86.sif", "arm.sif", "standin.sif")] == ["x86_64", "aarch64", "aarch64"]
    assert image_arch(tmp_path / "absent.sif") is None
    config = site_config("olivia")
    config["cluster"]["image"] = str(tmp_path / "x86.sif")
    config["cluster"]["images"] = {"aarch64": str(tmp_path / "x86.sif")}  # the wrong one for Grace
    errors, _ = check_images(Cluster.from_config(config), ["normal", "accel"])
    assert errors == [
        f"cluster.images.aarch64: {tmp_path}/x86.sif is built for x86_64, but accel's nodes are aarch64; give an "
        "aarch64 image (cluster.images.aarch64 in the site file)"
    ]
    config["cluster"]["images"] = {"aarch64": str(tmp_path / "arm.sif")}
    assert check_images(Cluster.from_config(config), ["normal", "accel"]) == ([], [])


def test_before_the_download_the_doctor_says_whether_the_dataset_fits_the_quota(tmp_path):
    from vcloud.runtime.budget import download_fit

    config = site_config("saga")
    project = tmp_path / "projects" / "nn1234k"
    project.mkdir(parents=True)
    config["data"]["raw"] = str(project / "data" / "SEN12MS-CR-TS")  # not downloaded yet
    quotas = {"projects": {"path": str(project), "bytes": 2**40, "files": 1000000}}  # Sigma2's default 1 TiB
    found = download_fit(config, quotas, {"projects": project})
    assert len(found) == 1 and "(~1.2 TiB, 20 archives) is more than the 1.1 TB quota of projects" in found[0]
    quotas["projects"]["bytes"] = 10 * 2**40  # raised to 10 TiB
    assert download_fit(config, quotas, {"projects": project}) == []
    config["data"]["rois"] = ["ROIs1868/119"]  # a few ROIs: their archives are counted once there
    quotas["projects"]["bytes"] = 2**40
    assert download_fit(config, quotas, {"projects": project}) == []


def test_a_rehearsal_entry_of_its_own_wins_but_the_full_runs_epoch_estimate_does_not(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({"resources": {"train_stage1": {"rehearse_warning": 4, "runtime": 5}}}))
    config = load_workflow_config(REPO / "config/lumi.yaml", REPO / "config/rehearsal.yaml", mine)
    stage1 = resources(config, "train_stage1")
    assert (stage1.rehearse_warning, stage1.runtime, stage1.partition) == (4, 5, "dev-g")
    assert stage1.epoch_minutes == 4  # config/lumi.yaml's 27 min is the full run's epoch
