"""vcloud doctor: each failure of the field reports is caught with one line naming the key."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import subprocess
from pathlib import Path

import pytest

from tests.system import require
from vcloud.config import load_model_config
from vcloud.runtime.cluster import Cluster
from vcloud.runtime.doctor import Report, bound_paths, check_memory, preflight
from vcloud.runtime.profile import load_workflow_config

REPO = Path(__file__).resolve().parents[2]
ALL_INPUTS = {f"train_stage{n}": {"train", "val", "wind_cache"} for n in range(4)}


@pytest.fixture(scope="module")
def base() -> dict:
    config = load_workflow_config(REPO / "config" / "lumi.yaml")
    config["cluster"]["account"] = "project_465000123"
    return config


@pytest.fixture(scope="module")
def model_set():
    return load_model_config(REPO / "config" / "models" / "full.yaml")


def good_args(config) -> tuple[str, str]:
    cluster = Cluster.from_config(config)
    return cluster.apptainer_args(), cluster.precommand()


def run(config, model_set, *, args=None, pre=None, inputs=ALL_INPUTS, overrides=None) -> Report:
    good_a, good_p = good_args(config)
    return preflight(
        config,
        model_set,
        apptainer_args=good_a if args is None else args,
        precommand=good_p if pre is None else pre,
        train_inputs=inputs,
        memory=False,
        overrides=overrides,
    )


def lumi_gpu_hours(entry: dict, *, partition_full: bool, gpus_per_node: int = 8) -> float:
    """LUMI's billing (FIELD-FACTS.md, LUMI user guide billing.md), written out independently
    of vcloud.runtime.billing: GPU-hours of one job at its requested wall time."""
    hours = entry["runtime"] / 60
    nodes = entry.get("nodes", 1)
    if partition_full:
        return 4 * nodes * hours
    gcds = entry["gpus"] * nodes
    mem_mb = entry.get("mem_mb_per_gpu", 0) * entry["gpus"] * nodes or entry["mem_mb"] * nodes
    cores = entry["gpus"] * entry.get("cpus_per_gpu", 7) * nodes
    return 0.5 * max(math.ceil(cores / 8), math.ceil(mem_mb / (64 * 1024)), gcds) * hours


def cpu_core_hours(entry: dict) -> float:
    """LUMI's `small` partition: max(cores, ceil(memory / 2 GB)) core-hours per hour."""
    return max(entry["threads"], math.ceil(entry["mem_mb"] / 2048)) * entry["runtime"] / 60


# Jobs per rule of config/lumi.yaml, counted by hand: the dataset's 53 ROIs (data.rois: all)
# lie in 20 archives (5 regions x s1/s2 x train/_test), one index_archive each; one
# prepare_roi per ROI; train, val and test assembled; the report rules are local (login node);
# synthetic data and predict are off.
LUMI_JOBS = {
    "synth_raw": 0,
    "index_archive": 20,
    "prepare_roi": 53,
    "assemble_split": 3,
    "wind_cache": 1,
    "train_stage0": 1,
    "train_stage1": 1,
    "train_stage2": 1,
    "train_stage3": 1,
    "fixed_protocol": 1,
    "evaluate_stage0": 1,
    "evaluate_stage1": 1,
    "evaluate_stage2": 1,
    "evaluate_stage3": 1,
    "export_viewer": 1,
    "predict": 0,
    "bundle": 0,
    "report_curves": 0,
    "report_tables": 0,
    "accounting": 0,
}


def hand_bill(config: dict, model_set) -> dict[str, tuple[int, str, float, float]]:
    """rule -> (jobs, unit, expected, worst), job by job, written out independently of
    vcloud.runtime.bill. Per hour: LUMI's formulas above. Expected hours of a training job: its
    epochs at epoch_minutes plus one start per SLURM job the epochs need (wall time less the
    warning and the start), capped by those jobs' wall times; else the wall time. Worst case:
    retries + 1 attempts at the wall time, where a training rule has the jobs its epochs need
    - 1 + spare_retries, an evaluation spare_retries, a CPU rule none."""
    cluster = config["cluster"]
    spare, restart = cluster["spare_retries"], cluster["restart_minutes"]
    out = {}
    for rule, entry in config["resources"].items():
        jobs = LUMI_JOBS[rule]
        if not jobs:
            continue
        wall = entry["runtime"] / 60
        if entry.get("gpus"):
            full = cluster["partitions"][entry["partition"]]["full_nodes"]
            unit, per_hour = "GPU-h", lumi_gpu_hours(entry, partition_full=full) / wall
        else:
            unit, per_hour = "core-h", cpu_core_hours(entry) / wall
        hours, attempts = wall, 1
        if rule.startswith("evaluate_"):
            attempts = spare + 1
        if rule.startswith("train_"):
            epochs = getattr(model_set, rule.removeprefix("train_")).train.epochs
            work = epochs * entry["epoch_minutes"]
            needed = math.ceil(work / (entry["runtime"] - cluster["signal_seconds"] / 60 - restart))
            hours = min(work + needed * restart, needed * entry["runtime"]) / 60
            attempts = needed + spare
        out[rule] = (jobs, unit, jobs * per_hour * hours, jobs * per_hour * attempts * wall)
    return out


BILL_LINE = re.compile(
    r"^  (?P<rule>\w+) +(?P<jobs>\d+) jobs? .* = (?P<expected>[\d.]+) (?P<unit>GPU-h|core-h) expected; "
    r"worst (?P=jobs) x [\d.]+ (?P=unit)/h x (?P<attempts>\d+) x [\d.]+ h = (?P<worst>[\d.]+) (?P=unit)$"
)


def printed_bill(report: Report) -> dict[str, tuple[int, str, float, float]]:
    """The doctor's bill lines as rule -> (jobs, unit, expected, worst); rules of 0 jobs left out."""
    found = {}
    for text in report.lines:
        if m := BILL_LINE.match(text):
            found[m["rule"]] = (int(m["jobs"]), m["unit"], float(m["expected"]), float(m["worst"]))
    return found


def printed_totals(report: Report) -> tuple[float, float, float, float]:
    """(GPU-h expected, GPU-h worst, core-h expected, core-h worst) of the total line."""
    text = next(x for x in report.lines if x.lstrip().startswith("total "))
    m = re.match(
        r"^  total ([\d.]+) GPU-h expected, ([\d.]+) GPU-h worst case \(.*\); "
        r"([\d.]+) CPU core-h expected, ([\d.]+) worst case$",
        text,
    )
    assert m, text
    return tuple(float(v) for v in m.groups())


def hand_totals(config: dict, model_set) -> tuple[float, float, float, float]:
    bill = hand_bill(config, model_set).values()
    return (
        sum(e for _, u, e, _ in bill if u == "GPU-h"),
        sum(w for _, u, _, w in bill if u == "GPU-h"),
        sum(e for _, u, e, _ in bill if u == "core-h"),
        sum(w for _, u, _, w in bill if u == "core-h"),
    )


def test_the_bill_of_lumi_yaml_adds_up_job_by_job(base, model_set, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # data.raw (../data/SEN12MS-CR-TS) not here: the dataset's 53 ROIs
    report = run(base, model_set)
    assert report.errors == []
    # The field facts' example: 1 GCD, 7 cores, 60 GB for 72 h -> 36 GPU-h (not the seeds' 72).
    assert lumi_gpu_hours({"runtime": 4320, "gpus": 1, "mem_mb": 60 * 1024}, partition_full=False) == 36
    want, got = hand_bill(base, model_set), printed_bill(report)
    assert got.keys() == want.keys()
    for rule, (jobs, unit, expected, worst) in want.items():
        assert got[rule][:2] == (jobs, unit), (rule, got[rule])
        assert got[rule][2] == pytest.approx(expected, abs=0.05), rule
        assert got[rule][3] == pytest.approx(worst, abs=0.05), rule
    for rule in ("synth_raw", "predict", "report_curves", "report_tables", "accounting"):
        assert any(x.startswith(f"  {rule} ") and " 0 jobs (" in x for x in report.lines), rule
    assert printed_totals(report) == pytest.approx(hand_totals(base, model_set), abs=0.1)
    # The same by hand once more, in numbers (config/lumi.yaml, full.yaml; 0.5 GPU-h per hour):
    # train 50 x 32 + 100 x 27 + 50 x 30 + 10 x 100 min + 4 starts x 10 min = 114 h -> 57,
    # evaluations 4 x 4 h -> 8: 65 GPU-h expected. Worst: each train rule 2 retries, each
    # evaluation 2: 3 x (3 x 72 + 48) h + 3 x 4 x 4 h = 840 h -> 420 GPU-h. CPU: index 20 x 4 x 2 h
    # = 160, prepare 53 x 8 x 4 h = 1,696, assemble 3 x 2 x 2 h = 12, wind 0.5, fixed protocol
    # 32 x 2 h = 64, viewer 8 x 2 h = 16: 1,948.5 core-h, no retries.
    assert printed_totals(report) == pytest.approx((65.0, 420.0, 1948.5, 1948.5), abs=0.06)


def test_a_measured_epoch_time_moves_the_expected_bill_not_the_price(base, model_set, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    good_a, good_p = good_args(base)
    report = preflight(
        base,
        model_set,
        apptainer_args=good_a,
        precommand=good_p,
        train_inputs=ALL_INPUTS,
        memory=False,
        epoch_minutes={"train_stage1": 60.0},
    )
    line = next(x for x in report.lines if x.startswith("  train_stage1 ") and "GPU-h/h" in x)
    # 100 epochs x 60 min = 100 h: 2 jobs of 72 h (68.8 h of training each), 2 starts.
    assert "100 epochs x 60.0 min measured + 2 x 10 min start" in line, line
    assert printed_bill(report)["train_stage1"] == pytest.approx(
        (1, "GPU-h", 0.5 * (6000 + 20) / 60, 0.5 * 4 * 72), abs=0.05
    )


def test_cpu_requests_fill_the_memory_slices_they_pay_for(base):
    """On `small`, a job pays max(cores, memory / 2 GB): each CPU rule that runs on LUMI asks
    for as many cores as slices (index_archive: one thread, its memory decides, and it no longer
    borrows prepare_roi's 4 cores and 16 GB), fixed_protocol excepted (32 LightGBM threads)."""
    res = base["resources"]
    assert res["index_archive"]["threads"] == 1 and cpu_core_hours(res["index_archive"]) / 2 == 4
    for rule in ("prepare_roi", "assemble_split", "wind_cache", "export_viewer"):
        assert res[rule]["threads"] == math.ceil(res[rule]["mem_mb"] / 2048), rule
    data_rules = (REPO / "workflow" / "rules" / "data.smk").read_text()
    index_rule = data_rules[data_rules.index("rule index_archive:") : data_rules.index("rule prepare_roi:")]
    assert 'get_slurm_resources("index_archive")' in index_rule and "prepare_roi" not in index_rule


def test_local_rules_are_the_workflows(base):
    """The bill leaves out exactly the rules report.smk runs on the login node."""
    from vcloud.runtime.bill import LOCAL_RULES

    text = (REPO / "workflow" / "rules" / "report.smk").read_text()
    block = text[text.index("localrules:") :].split("\n\n")[0]
    assert {w.strip(" ,") for w in block.splitlines()[1:]} <= set(LOCAL_RULES)


def test_archives_and_rois_follow_the_rois_to_prepare(base, model_set, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = copy.deepcopy(base)
    # One train ROI of europa and one test ROI of asiaEast: s1/s2_europa, s1/s2_asiaEast_test.
    config["data"]["rois"] = ["ROIs1970/71", "ROIs1868/73"]
    config["predict"]["enabled"] = True
    bill = printed_bill(run(config, model_set))
    assert bill["index_archive"][0] == 4 and bill["prepare_roi"][0] == 2
    assert bill["predict"][0] == 1  # predict.split test: ROIs1868/73
    assert bill["predict"][3] == pytest.approx(3 * 0.5 * 4)  # 2 spare retries of 4 h


@pytest.mark.parametrize(
    "change",
    [
        {"gpus": 1, "cpus_per_gpu": 16},  # the seeds' sbatch: cores decide (max(2, 1, 1))
        {"gpus": 2, "mem_mb_per_gpu": 200000},  # memory decides
        {"gpus": 8, "partition": "dev-g", "runtime": 180},  # GCDs decide; memory follows them
        {"gpus": 4, "cpus_per_gpu": 7, "partition": "dev-g", "runtime": 180},
    ],
)
def test_billing_follows_lumis_formula(base, model_set, change):
    config = copy.deepcopy(base)
    config["resources"]["train_stage1"].update(change)
    report = run(config, model_set)
    assert not [e for e in report.errors if "train_stage1" in e], report.errors
    entry = config["resources"]["train_stage1"]
    per_hour = lumi_gpu_hours(entry, partition_full=False) / (entry["runtime"] / 60)
    line = next(x for x in report.lines if x.startswith("  train_stage1 ") and "GPU-h/h" in x)
    assert f" x {per_hour:g} GPU-h/h [" in line, line
    assert printed_totals(report) == pytest.approx(hand_totals(config, model_set), abs=0.1)


def test_cpu_rules_are_billed_in_core_hours(base, model_set):
    report = run(base, model_set)
    entry = base["resources"]["prepare_roi"]
    per_hour = max(entry["threads"], math.ceil(entry["mem_mb"] / 2048))
    line = next(line for line in report.lines if line.startswith("  prepare_roi "))
    assert f" x {per_hour:g} core-h/h [max({entry['threads']} cores, " in line, line
    assert f" = {53 * per_hour * entry['runtime'] / 60:.1f} core-h expected;" in line, line


def test_memory_follows_the_gcds(base):
    from vcloud.runtime.cluster import RuleResources

    config = copy.deepcopy(base)
    per_gpu = config["resources"]["train_stage1"]["mem_mb_per_gpu"]
    for gpus in (1, 4, 8):
        config["resources"]["train_stage1"]["gpus"] = gpus
        assert RuleResources.from_config(config, "train_stage1").mem_mb == per_gpu * gpus
    res = RuleResources.from_config(config, "train_stage1").with_overrides({"gpu": 16, "nodes": 2})
    assert (res.gpus, res.nodes, res.mem_mb) == (8, 2, per_gpu * 8)  # --mem is per node
    assert res.with_overrides({"mem_mb": 1000}).mem_mb == 1000  # an explicit override wins


def test_set_resources_moves_the_doctor_and_bad_ones_are_refused(base, model_set):
    over = {"train_stage1": {"gpu": 8}}
    report = run(base, model_set, overrides=over)
    config = copy.deepcopy(base)
    # A whole node goes to standard-g, its wall time capped at standard-g's 2 days.
    config["resources"]["train_stage1"].update(gpus=8, partition="standard-g", runtime=2880)
    assert printed_totals(report) == pytest.approx(hand_totals(config, model_set), abs=0.1)
    assert any("train_stage1" in line and "4 x 1 nodes" in line for line in report.lines)
    report = run(base, model_set, overrides={"train_stage1": {"tasks_per_gpu": 1}})
    assert report.errors == [
        "--set-resources train_stage1:tasks_per_gpu: vcloud sets the task geometry "
        "itself; change gpu, nodes or cpus_per_gpu (or resources.train_stage1) instead"
    ]


def test_retries_cover_the_epochs(base, model_set):
    from vcloud.runtime.doctor import Report, check_resubmission

    config = copy.deepcopy(base)
    config["resources"]["train_stage1"].update(runtime=180, partition="dev-g")
    cluster = Cluster.from_config(config)
    report = Report()
    check_resubmission(config, model_set, cluster, report)
    epochs = model_set.stage1.train.epochs
    minutes = config["resources"]["train_stage1"]["epoch_minutes"]
    useful = 180 - cluster.signal_seconds / 60 - cluster.restart_minutes
    want = math.ceil(epochs * minutes / useful) - 1 + cluster.spare_retries
    line = next(x for x in report.lines if "train_stage1" in x)
    assert line.endswith(f"{want} retries") and "(estimated)" in line
    report = Report()  # a measured epoch time wins over the estimate
    check_resubmission(config, model_set, cluster, report, epoch_minutes={"train_stage1": 1.0})
    want = math.ceil(epochs * 1.0 / useful) - 1 + cluster.spare_retries
    assert next(x for x in report.lines if "train_stage1" in x).endswith(f"{want} retries")
    assert "SLURM requeues only on node failure or preemption" in report.lines[0]


def test_rocm_is_refused(base, model_set):
    args, _ = good_args(base)
    report = run(base, model_set, args=args + " --rocm")
    assert len(report.errors) == 1 and "--rocm" in report.errors[0]


@pytest.mark.parametrize(
    "missing",
    ["/opt/cray", "/pfs", "/scratch/project_465000123", "/projappl/project_465000123", "/flash/project_465000123"],
)
def test_each_missing_bind_is_named(base, model_set, missing):
    args = " ".join(f"-B {p}" for p in Cluster.from_config(base).binds if p != missing)
    report = run(base, model_set, args=args)
    assert report.errors == [
        f"apptainer-args: bind {missing} missing (cluster.binds; regenerate the profile with `vcloud lumi-profile`)"
    ]


def test_bind_parsing_accepts_lists_and_destinations():
    assert bound_paths("--bind /a:/x,/b/ -B /c:/c:ro --bind=/d") == {"/a", "/b", "/c", "/d"}


def test_missing_containlib_is_named(base, model_set):
    report = run(base, model_set, pre="export SINGULARITY_CONTAINLIBS=/usr/lib64/libcxi.so.1")
    assert len(report.errors) == 1 and "librocm_smi64.so.7" in report.errors[0]


def test_placeholder_account(base, model_set):
    config = copy.deepcopy(base)
    config["cluster"]["account"] = "project_465XXXXXX"
    report = run(config, model_set)
    assert len(report.errors) == 1 and report.errors[0].startswith("cluster.account:")


@pytest.mark.parametrize(
    "change,expected",
    [
        ({"cpus_per_gpu": 1}, "resources.train_stage1.cpus_per_gpu: 1 x 1 = 1 core; a GPU rule needs 2"),
        ({"runtime": 4321}, "resources.train_stage1.runtime: 3-00:01:00 is above the small-g limit"),
        (
            {"partition": "standard-g", "gpus": 8, "runtime": 2881},
            "resources.train_stage1.runtime: 2-00:01:00 is above the standard-g",
        ),
        ({"partition": "small"}, "resources.train_stage1.gpus: small has no GPUs"),
        (
            {"partition": "standard-g", "gpus": 1, "runtime": 2880},
            "resources.train_stage1.gpus: standard-g allocates and bills whole nodes",
        ),
        ({"gpus": 9}, "resources.train_stage1.gpus: 9 per node, but a small-g node has 8 GCDs"),
        ({"nodes": 2, "gpus": 4}, "resources.train_stage1.nodes: 2 nodes do not fit small-g"),
        ({"partition": "gpu-a100"}, "resources.train_stage1.partition: 'gpu-a100' is not one of"),
        ({"cpus_per_gpu": 8, "gpus": 8}, "resources.train_stage1.cpus_per_gpu: 8 x 8 GCDs"),
        ({"gpus": 0}, "resources.train_stage1.gpus: 0 on the GPU partition small-g"),
    ],
)
def test_partition_limits(base, model_set, change, expected):
    config = copy.deepcopy(base)
    config["resources"]["train_stage1"].update(change)
    report = run(config, model_set)
    assert report.errors[0].startswith(expected), report.errors
    assert all(e.startswith("resources.train_stage1.") for e in report.errors)


def test_multinode_on_standard_g_passes(base, model_set):
    config = copy.deepcopy(base)
    config["resources"]["train_stage1"].update(partition="standard-g", nodes=4, gpus=8, runtime=2880)
    report = run(config, model_set)
    assert report.errors == []
    per_hour = lumi_gpu_hours(config["resources"]["train_stage1"], partition_full=True) / 48  # 4 x 4 nodes
    assert any(
        line.startswith("  train_stage1 ") and f"x {per_hour:g} GPU-h/h [4 x 4 nodes]" in line for line in report.lines
    )
    assert printed_totals(report) == pytest.approx(hand_totals(config, model_set), abs=0.1)


def test_budget_exceeded(base, model_set):
    config = copy.deepcopy(base)
    config["cluster"]["gpu_hour_budget"] = 100  # above the expected 65 GPU-h, below the worst 420
    report = run(config, model_set)
    assert report.errors == []
    assert (
        "cluster.gpu_hour_budget: the worst case (every retry at its full wall time) needs 420 GPU-h, "
        "more than the budget of 100"
    ) in report.warnings
    config["cluster"]["gpu_hour_budget"] = 50
    report = run(config, model_set)
    assert report.errors == [
        "cluster.gpu_hour_budget: the run is expected to need 65 GPU-h, more than the budget of 50"
    ]


def test_distributed_wind_scan_without_cache_input(base, model_set):
    config = copy.deepcopy(base)
    config["resources"]["train_stage2"]["gpus"] = 8
    wind = dataclasses.replace(model_set.stage1.model, wind_scan=True)
    scanning = dataclasses.replace(model_set, stage1=dataclasses.replace(model_set.stage1, model=wind))
    inputs = dict(ALL_INPUTS, train_stage2={"train", "val"})
    report = run(config, scanning, inputs=inputs)
    assert report.errors == [
        "train_stage2: 8 ranks scan by wind but the rule does not take the "
        "wind cache (results/wind/scan_orders.npz) as input"
    ]
    calm = dataclasses.replace(model_set.stage1.model, wind_scan=False)
    no_scan = dataclasses.replace(model_set, stage1=dataclasses.replace(model_set.stage1, model=calm))
    assert run(config, no_scan, inputs=inputs).errors == []  # no wind scan: no cache needed


def test_memory_above_one_gcd(base, model_set):
    report = Report()
    check_memory(model_set, Cluster.from_config(base), report, estimate={"cfdt_gb_configured": 84.6})
    assert report.errors and report.errors[0].startswith("memory: the stage-1 step needs about 84.6 GB")
    report = Report()
    check_memory(model_set, Cluster.from_config(base), report, estimate={"cfdt_gb_configured": 6.0})
    assert report.errors == []


@pytest.mark.slow  # over 10 s: docs/contributing.md, test tiers
def test_cli_exits_nonzero_with_one_line_per_problem(tmp_path):
    """The shipped placeholder account fails the pre-flight from the command line."""
    require("the vcloud command", "vcloud", install="pip install -e . installs it")
    out = subprocess.run(
        [
            "vcloud",
            "doctor",
            "--profile",
            str(REPO / "profiles" / "lumi"),
            "--config",
            str(REPO / "config" / "lumi.yaml"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 2
    errors = [line for line in out.stdout.splitlines() if line.startswith("error:")]
    image = "/appl/local/csc/soft/ai/images/pytorch_2.5.1_lumi_rocm6.2.4_flash-attn-3.0.0.post1.sif"
    env = "/projappl/project_465XXXXXX/vcloud/vcloud-env.sqsh"
    # Off LUMI, the binds' sources are missing here and the repository is outside them too.
    assert errors[0] == (
        "error: cluster.account: 'project_465XXXXXX' is a placeholder; set your LUMI "
        "project (e.g. project_465000123) in config/lumi.yaml"
    )
    assert "error: cluster.binds: /pfs does not exist on this node; apptainer refuses a missing bind source" in errors
    assert any(e.startswith("error: working directory: . (really ") for e in errors)
    assert f"error: cluster.image: {image} not found; see the README quick start (`vcloud image`)" in errors
    assert f"error: cluster.env_image: {env} not found; build it with `vcloud image`" in errors
    assert "stage-1 memory estimate" in out.stdout and "GPU-h budget" in out.stdout


# --- the paths jobs see, whole nodes, dev-g, host versions ----------------------------------


def _lumi_like(tmp_path, base):
    """A LUMI-like tree: /scratch/<project> a symlink into /pfs/lustrep2, the clone in it."""
    real = tmp_path / "pfs" / "lustrep2" / "scratch" / "project_465000123"
    (real / "vcloud" / "code").mkdir(parents=True)
    (real / "vcloud" / "data" / "SEN12MS-CR-TS").mkdir(parents=True)
    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch" / "project_465000123").symlink_to(real)
    config = copy.deepcopy(base)
    config["cluster"]["binds"] = [str(tmp_path / "scratch" / "project_465000123")]
    config["cluster"]["env_image"] = None
    return config, tmp_path / "scratch" / "project_465000123" / "vcloud" / "code", real


def test_paths_behind_a_symlink_need_their_real_folder_bound(tmp_path, base, model_set):
    from vcloud.runtime.doctor import check_paths

    config, code, real = _lumi_like(tmp_path, base)
    report = Report()
    check_paths(config, Cluster.from_config(config), report, code)
    keys = [e.split(":")[0] for e in report.errors]
    assert keys == ["working directory", "data.raw", "data.wind_table", "paths.prepared", "paths.results"]
    assert report.errors[3] == (
        f"paths.prepared: ../data/prepared (really {real / 'vcloud/data/prepared'}) is outside every bind of "
        f"cluster.binds, so no container sees it; add /{str(real).strip('/').split('/')[0]} (or that folder) to "
        "cluster.binds and run `vcloud lumi-profile`"
    )
    config["cluster"]["binds"].append(str(tmp_path / "pfs"))
    report = Report()
    check_paths(config, Cluster.from_config(config), report, code)
    assert report.errors == []


def test_missing_bind_source_is_named(tmp_path, base, model_set):
    from vcloud.runtime.doctor import check_paths

    config, code, _ = _lumi_like(tmp_path, base)
    config["cluster"]["binds"] += [str(tmp_path / "pfs"), str(tmp_path / "flash")]
    report = Report()
    check_paths(config, Cluster.from_config(config), report, code)
    assert report.errors == [
        f"cluster.binds: {tmp_path / 'flash'} does not exist on this node; apptainer refuses a missing bind source"
    ]


def test_a_whole_node_goes_to_standard_g_with_one_task_per_gcd(base):
    from vcloud.runtime.cluster import RuleResources
    from vcloud.runtime.slurm import launch_prefix, slurm_resources

    cluster = Cluster.from_config(base)
    res = cluster.place(RuleResources.from_config(base, "train_stage1").with_overrides({"gpu": 8}), {"gpu": 8})
    assert (res.partition, res.runtime) == ("standard-g", 2880)  # capped at standard-g's 2 days
    slurm = slurm_resources(res, cluster)
    assert slurm["tasks_per_node"] == 8 and slurm["slurm_partition"] == "standard-g"
    line = launch_prefix(res, cluster)
    assert "srun --nodes=1 --ntasks-per-node=8 --gpus-per-node=8 --cpu-bind=mask_cpu:0xfe000000000000," in line
    assert "torchrun" not in line
    # Set on the command line, the partition stays, and the doctor names the price.
    over = {"gpu": 8, "slurm_partition": "small-g"}
    kept = cluster.place(RuleResources.from_config(base, "train_stage1").with_overrides(over), over)
    assert kept.partition == "small-g" and "torchrun --standalone" in launch_prefix(kept, cluster)
    report = run(base, load_model_config(REPO / "config/models/full.yaml"), overrides={"train_stage1": over})
    assert any(
        w.startswith("resources.train_stage1: all 8 GCDs of a node on small-g cost 4 GPU-h/h") for w in report.warnings
    )


def test_dev_g_runs_one_job_at_a_time(base):
    from vcloud.runtime.cluster import RuleResources
    from vcloud.runtime.profile import render
    from vcloud.runtime.slurm import slurm_resources

    config = copy.deepcopy(base)
    config["resources"]["train_stage1"].update(partition="dev-g", runtime=60)
    cluster = Cluster.from_config(config)
    assert slurm_resources(RuleResources.from_config(config, "train_stage1"), cluster)["dev_g_jobs"] == 1
    assert "dev_g_jobs" not in slurm_resources(RuleResources.from_config(config, "train_stage2"), cluster)
    assert "resources:\n- dev_g_jobs=1\n" in render(cluster)


def test_host_python_below_3_11_says_what_to_load():
    from vcloud.runtime.profile import host_python_problem

    assert host_python_problem((3, 11, 7)) is None
    assert host_python_problem((3, 6, 15)) == (
        "python: 3.6.15 on the host; snakemake 9 and the SLURM plugin need >= 3.11: on LUMI `module load "
        "cray-python` (the OS python3 is 3.6), then make the venv again (README, LUMI quick start)"
    )


def test_host_versions_other_than_the_pins_are_named(tmp_path, monkeypatch):
    from vcloud.runtime import profile

    (tmp_path / profile.HOST_CONSTRAINTS).write_text("snakemake==1.0.0  # tested\nother==2\n")
    warnings = profile.version_warnings(tmp_path)
    assert len(warnings) == 1 and warnings[0].startswith("snakemake: ") and "tested with 1.0.0" in warnings[0]
    assert profile.version_warnings(REPO) == []  # this machine runs the pinned host versions
