"""The dev-g rehearsal (config/lumi-rehearsal.yaml over config/lumi.yaml): the real run's rules
and architectures, one short epoch each, every GPU job on dev-g, for under 1 GPU-h."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from vcloud.config import config_to_dict, load_model_config
from vcloud.runtime.cluster import Cluster
from vcloud.runtime.doctor import preflight
from vcloud.runtime.profile import load_workflow_config

REPO = Path(__file__).resolve().parents[2]
INPUTS = {f"train_stage{n}": {"train", "val", "wind_cache"} for n in range(4)}


def rehearsal_config() -> dict:
    config = load_workflow_config(REPO / "config/lumi.yaml", REPO / "config/lumi-rehearsal.yaml")
    config["cluster"]["account"] = "project_465000123"
    return config


def test_every_gpu_rule_runs_on_dev_g_and_the_bill_is_under_one_gpu_hour():
    config = rehearsal_config()
    models = load_model_config(REPO / config["model_config"])
    cluster = Cluster.from_config(config)
    report = preflight(
        config,
        models,
        apptainer_args=cluster.apptainer_args(),
        precommand=cluster.precommand(),
        train_inputs=INPUTS,
        memory=False,
    )
    assert [e for e in report.errors if e.startswith("resources.")] == []
    gpu_rules = [rule for rule, entry in config["resources"].items() if entry.get("gpus")]
    assert {config["resources"][rule]["partition"] for rule in gpu_rules if rule != "predict"} == {"dev-g"}
    total = next(line for line in report.lines if line.lstrip().startswith("total "))
    gpu_hours = float(total.split()[1])  # expected (the doctor's bill; predict is opt-in, off)
    # Expected: each training job 1 epoch x 4 min + a 3 min start, each evaluation its 6 min, of
    # one GCD, and the 8-GCD transport step for 4 min, at 0.5 GPU-h per GCD-hour.
    assert gpu_hours < 1.0, total
    # Every job failing and retried to the end (spare_retries 1): 2 attempts of each 1-GCD job.
    worst = float(total.split("expected, ")[1].split()[0])
    assert abs(worst - (2 * 0.5 * (4 * 12 + 4 * 6) / 60 + 0.5 * 8 * 4 / 60)) < 0.05, total
    assert abs(gpu_hours - (0.5 * (4 * (4 + 3) + 4 * 6) / 60 + 0.5 * 8 * 4 / 60)) < 0.05, total
    assert config["data"]["rois"] == ["ROIs1970/21", "ROIs2017/22", "ROIs2017/32"]
    assert config["paths"]["results"] == "results-rehearsal"


def test_the_rehearsal_trains_the_full_architectures():
    """Everything but the epoch and sample counts is full.yaml's: the memory, kernels and
    settings rehearsed are the real run's."""
    full = config_to_dict(load_model_config(REPO / "config/models/full.yaml"))
    rehearsal = config_to_dict(load_model_config(REPO / "config/models/rehearsal.yaml"))  # based_on full.yaml
    assert rehearsal.pop("name") == "rehearsal" and full.pop("name") == "full"
    for section in ("data", "stage0", "stage1", "stage2", "stage3"):
        a, b = copy.deepcopy(full[section]), copy.deepcopy(rehearsal[section])
        if "train" in a:
            assert b["train"]["epochs"] == 1
            a["train"].pop("epochs"), b["train"].pop("epochs")
        if section == "data":
            assert (b["samples_per_epoch"], b["val_samples"]) == (64, 16)
            for key in ("samples_per_epoch", "val_samples"):
                a.pop(key), b.pop(key)
        assert a == b, section
    load_model_config(REPO / "config/models/rehearsal.yaml")  # a valid model config


# --- the forced wall-time warning (runtime/launch.py --warn-after) --------------------------

TRAINER = """
import signal, sys, time, pathlib
out = pathlib.Path(sys.argv[sys.argv.index('--out') + 1])
time.sleep(0.6)  # start-up: a warning now is ignored (inherited), not fatal
flag = []
signal.signal(signal.SIGUSR1, lambda *a: flag.append(1))
for step in range(200):
    if flag:
        (out / 'latest.pt').write_text(str(step))
        sys.exit(3)
    time.sleep(0.05)
(out / 'best.pt').write_text('done')
"""


@pytest.mark.slow  # over 10 s: docs/contributing.md, test tiers
def test_warn_after_forces_one_warning_and_the_resubmitted_job_resumes(tmp_path):
    """First job: SIGUSR1 arrives (early ones ignored until the handler exists), the trainer
    writes latest.pt and exits 3. The resubmitted job finds latest.pt: no warning, it finishes."""
    import subprocess
    import sys

    out = tmp_path / "stage1"
    out.mkdir()
    (tmp_path / "trainer.py").write_text(TRAINER)
    command = [sys.executable, "-m", "vcloud.runtime.launch", "--warn-after", "0.2"]
    command += [sys.executable, str(tmp_path / "trainer.py"), "--out", str(out)]
    first = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert first.returncode == 3, first.stderr
    assert "rehearsal: SIGUSR1 to the trainer after 0.2 s" in first.stderr
    assert (out / "latest.pt").is_file() and not (out / "best.pt").exists()
    second = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    assert "SIGUSR1" not in second.stderr and (out / "best.pt").read_text() == "done"


def test_warn_after_is_in_the_launch_line_of_one_gcd_only(tmp_path):
    from vcloud.runtime.cluster import RuleResources
    from vcloud.runtime.doctor import Report, check_resources
    from vcloud.runtime.slurm import launch_prefix

    config = rehearsal_config()
    cluster = Cluster.from_config(config)
    line = launch_prefix(RuleResources.from_config(config, "train_stage1"), cluster)
    assert line.endswith("python3 -m vcloud.runtime.launch --warn-after 150")
    assert "--warn-after" not in launch_prefix(RuleResources.from_config(config, "train_stage2"), cluster)
    config["resources"]["train_stage1"]["gpus"] = 2
    report = Report()
    check_resources(config, cluster, report)
    assert "resources.train_stage1.rehearse_warning: the forced warning runs on one GCD only, not 2 ranks" in (
        report.errors
    )


# --- RCCL's transport ----------------------------------------------------------------------

GOOD = """nid005001:1:1 [0] NCCL INFO NET/OFI Using aws-ofi-rccl 1.4.0
nid005001:1:1 [0] NCCL INFO NET/OFI Selected Provider is cxi (found 4 nics)
"""


def test_transport_needs_the_plugin_and_cxi_on_every_rank():
    from vcloud.runtime.transport import transport_problems

    assert transport_problems({"rccl.a.1.log": GOOD, "rccl.a.2.log": GOOD}) == []
    sockets = "nid005001:1:1 [0] NCCL INFO NET/Socket : Using [0]hsn0:10.0.0.1<0>\n"
    assert transport_problems({"rccl.a.1.log": GOOD, "rccl.a.2.log": sockets}) == [
        "rccl.a.2.log: no aws-ofi-rccl and no cxi line"
    ]
    no_cxi = "NCCL INFO NET/OFI Using aws-ofi-rccl 1.4.0\nNCCL INFO NET/OFI Selected Provider is tcp\n"
    assert transport_problems({"x": no_cxi}) == ["x: no cxi line"]
    assert transport_problems({})[0].startswith("no RCCL log at all")


def test_rccl_check_without_rccl_fails_in_one_line_and_writes_no_output(tmp_path):
    """On CPU (gloo) RCCL logs nothing: the check must fail, not pass silently."""
    import subprocess
    import sys

    out = tmp_path / "transport.json"
    proc = subprocess.run(
        [sys.executable, "-m", "vcloud.cli", "rccl-check", "--log-dir", str(tmp_path / "rccl"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "RCCL did not use the aws-ofi-rccl plugin over cxi (no RCCL log at all" in lines[0]
    assert not out.exists() and (tmp_path / "transport.json.failed").is_file()


# --- the summary and the doctor's advice ----------------------------------------------------


def _fake_run(results: Path, logs: Path, *, resumed: bool) -> None:
    from vcloud.registry import STAGES

    for stage in STAGES:
        (results / stage.name).mkdir(parents=True)
        (results / stage.name / "best.pt").write_text("x")
        rows = [{"epoch": 0, "samples_per_s": 4.0, "peak_memory_mb": 6144 * (stage.number + 1)}]
        (results / stage.name / "metrics.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
        (logs / stage.train_rule).mkdir(parents=True)
        text = (
            "rank 0/1 local 0 (slurm) on nid005001 master nid005001:29501 device cuda:0 of 1 (hip 6.2.41134) "
            "ROCR_VISIBLE_DEVICES=0 cpu affinity fe000000000000; torch threads 7\n"
        )
        if resumed and stage.number == 1:
            text += "stage 1: resuming from results/stage1/latest.pt at epoch 0 step 12\n"
        (logs / stage.train_rule / f"{stage.train_rule}.log").write_text(text)


def test_summary_passes_on_a_complete_rehearsal_and_gives_the_epoch_minutes(tmp_path):
    from vcloud.runtime import rehearsal

    _fake_run(tmp_path / "results", tmp_path / "logs", resumed=True)
    (tmp_path / "transport.json").write_text('{"ok": true, "hip": "6.2.41134"}')
    summary = rehearsal.summarize(
        results=tmp_path / "results",
        logs=tmp_path / "logs",
        stamp="vcloud 0.1.0 abc src 0123456789abcdef",
        miopen_cache="/tmp/{user}-miopen-cache-{node}",
        transport=tmp_path / "transport.json",
        full_samples_per_epoch={"stage0": 600, "stage1": 1200, "stage2": 600, "stage3": 600},
        train_locations=600,
        stage1_estimate_gb=6.1,
    )
    assert summary["passed"], summary["problems"]
    assert (summary["gpus_visible"], summary["gpu_runtime"], summary["cpu_masks"]) == (
        1,
        "hip 6.2.41134",
        ["fe000000000000"],
    )
    assert (
        "  GPUs visible 1, GPU runtime HIP 6.2.41134, image vcloud 0.1.0 abc src 0123456789abcdef"
        in rehearsal.lines(summary)
    )
    # 0.25 s per sample: 1200 samples = 5 minutes of stage 1.
    assert summary["epoch_minutes"]["train_stage1"] == 5.0
    # What those minutes are for, which the bill scales other samples per epoch from.
    assert summary["epoch_samples"]["train_stage1"] == 1200 and summary["train_locations"] == 600
    assert summary["stage1_memory"] == {"peak_gb": 12.0, "estimate_gb": 6.1}
    assert any("resources.train_stage1.epoch_minutes: 5.0" in line for line in rehearsal.lines(summary))


@pytest.mark.slow  # over 10 s: docs/contributing.md, test tiers
def test_the_summary_of_a_grids_rehearsal_names_the_run_it_tried(tmp_path):
    from vcloud.cli import main
    from vcloud.runtime import rehearsal

    _fake_run(tmp_path / "results", tmp_path / "logs", resumed=True)
    out = tmp_path / "rehearsal.json"
    argv = ["rehearsal-summary", "--results", str(tmp_path / "results"), "--logs", str(tmp_path / "logs")]
    argv += ["--config", str(REPO / "tests/workflow/tiny_models.yaml"), "--out", str(out)]
    assert main([*argv, "--experiment", "s3_long", "--seed", "3"]) == 0
    summary = __import__("json").loads(out.read_text())
    assert summary["passed"] and summary["run"] == {"experiment": "s3_long", "seed": 3}
    assert "  rehearsed one run of the grid: experiment s3_long, seed 3" in rehearsal.lines(summary)
    assert main(argv) == 0  # a single run's rehearsal: no run named
    assert __import__("json").loads(out.read_text())["run"] is None


def test_summary_fails_without_the_resume_or_the_transport(tmp_path):
    from vcloud.runtime import rehearsal

    _fake_run(tmp_path / "results", tmp_path / "logs", resumed=False)
    summary = rehearsal.summarize(
        results=tmp_path / "results",
        logs=tmp_path / "logs",
        stamp=None,
        miopen_cache=None,
        transport=tmp_path / "missing.json",
    )
    assert not summary["passed"]
    assert summary["problems"] == [
        "no stage resumed after the forced wall-time warning (resources.<rule>.rehearse_warning)",
        "the transport check of the collectives did not pass (rehearse_transport)",
    ]


def test_the_doctor_recommends_the_rehearsal_until_one_passed_for_this_image(tmp_path, monkeypatch):
    import json

    from vcloud.runtime.rehearsal import doctor_warning

    monkeypatch.chdir(tmp_path)
    config = load_workflow_config(REPO / "config/lumi.yaml")
    stamp = "vcloud 0.1.0 abc src 0123456789abcdef"
    assert doctor_warning(config, stamp).startswith("rehearsal: none yet (results-rehearsal/rehearsal.json)")
    summary = tmp_path / "results-rehearsal" / "rehearsal.json"
    summary.parent.mkdir()
    summary.with_name("rehearsal.json.failed").write_text(
        json.dumps({"passed": False, "problems": ["stage2: not finished"]})
    )
    assert "did not pass (stage2: not finished)" in doctor_warning(config, stamp)
    summary.write_text(json.dumps({"passed": True, "stamp": "vcloud 0.1.0 abc src ffffffffffffffff"}))
    assert "passed with another environment image" in doctor_warning(config, stamp)
    summary.write_text(json.dumps({"passed": True, "stamp": "vcloud 0.1.0 def src 0123456789abcdef"}))
    assert doctor_warning(config, stamp) is None  # another commit, the same installed code
    assert doctor_warning(rehearsal_config(), stamp) is None  # the rehearsal itself


def test_the_rehearsals_epoch_minutes_replace_the_estimates_until_the_run_measures(tmp_path, monkeypatch):
    import json

    from vcloud.runtime.doctor import measured_epoch_minutes

    monkeypatch.chdir(tmp_path)
    config = load_workflow_config(REPO / "config/lumi.yaml")
    assert measured_epoch_minutes(config) == {}
    summary = tmp_path / "results-rehearsal" / "rehearsal.json"
    summary.parent.mkdir()
    summary.write_text(json.dumps({"passed": True, "epoch_minutes": {"train_stage1": 23.5, "train_stage2": 9.0}}))
    assert measured_epoch_minutes(config) == {"train_stage1": 23.5, "train_stage2": 9.0}
    (tmp_path / "results/stage1").mkdir(parents=True)
    rows = [{"epoch": 0, "wall_time": 0.0}, {"epoch": 1, "wall_time": 1200.0}]
    (tmp_path / "results/stage1/metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert measured_epoch_minutes(config)["train_stage1"] == 20.0  # the run's own epochs win
    summary.write_text(json.dumps({"passed": False, "epoch_minutes": {"train_stage2": 9.0}}))
    assert "train_stage2" not in measured_epoch_minutes(config)


def test_summary_of_an_nvidia_site_names_cuda_and_no_miopen_cache(tmp_path):
    from vcloud.runtime import rehearsal

    _fake_run(tmp_path / "results", tmp_path / "logs", resumed=True)
    for log in (tmp_path / "logs").glob("*/*.log"):  # the rank line a CUDA build writes (train/distributed.py)
        text = log.read_text().replace("(hip 6.2.41134) ROCR_VISIBLE_DEVICES=0", "(cuda 12.4) CUDA_VISIBLE_DEVICES=0")
        log.write_text(text.replace("of 1 (", "of 4 ("))
    (tmp_path / "transport.json").write_text('{"ok": true, "hip": null, "cuda": "12.4"}')
    summary = rehearsal.summarize(
        results=tmp_path / "results",
        logs=tmp_path / "logs",
        stamp="vcloud 0.1.0 abc src 0123456789abcdef",
        miopen_cache=None,
        transport=tmp_path / "transport.json",
    )
    assert summary["passed"] and (summary["gpus_visible"], summary["gpu_runtime"]) == (4, "cuda 12.4")
    text = "\n".join(rehearsal.lines(summary))
    assert "GPUs visible 4, GPU runtime CUDA 12.4" in text and "MIOpen" not in text and "HIP" not in text
