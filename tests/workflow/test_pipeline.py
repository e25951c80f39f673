"""The data part of the DAG through the snakemake command line, as a user runs it."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from vcloud.data.store import open_store

ROOT = Path(__file__).parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile")]
pytestmark = pytest.mark.workflow

SMALL = {
    "data": {"patch_size": 32},
    "synthetic": {"patches": 2},
    "model_config": str(ROOT / "tests/workflow/tiny_models.yaml"),
}


def run(args, cwd, check=True):
    proc = subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def test_lint_is_clean():
    proc = run(["--lint"], cwd=ROOT)
    assert "Congratulations, your workflow is in a good condition" in proc.stdout + proc.stderr


def test_snakefmt_is_clean():
    files = [ROOT / "Snakefile", *sorted((ROOT / "workflow/rules").glob("*.smk"))]
    proc = subprocess.run([sys.executable, "-m", "snakefmt", "--check", *map(str, files)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_bad_config_key_stops_the_dry_run_with_its_name(tmp_path):
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"data": {"on_bad_imagee": "skip"}}))
    proc = run(["-n", "--configfile", "bad.yaml", "-d", str(tmp_path)], cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "unknown key data.on_bad_imagee" in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def data_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("wf")
    (work / "small.yaml").write_text(yaml.safe_dump(SMALL))
    dry = run(["-n", "--configfile", "small.yaml", "-d", str(work)], cwd=work)
    real = run(["--cores", "2", "--configfile", "small.yaml", "-d", str(work)], cwd=work)
    return work, dry, real


def test_dry_run_plans_one_prepare_job_per_roi(data_run):
    _, dry, _ = data_run
    text = dry.stdout + dry.stderr
    plan = [("synth_raw", 1), ("prepare_roi", 4), ("assemble_split", 3)]
    plan += [(f"train_stage{n}", 1) for n in range(4)] + [(f"evaluate_stage{n}", 1) for n in range(4)]
    for rule, count in plan:
        assert any(line.split() == [rule, str(count)] for line in text.splitlines()), text[-2000:]


def test_data_part_writes_split_stores_logs_and_benchmarks(data_run):
    work, _, _ = data_run
    expected = {"train": ["ROIs1158_119", "ROIs1970_22"], "val": ["ROIs2017_22"], "test": ["ROIs1868_119"]}
    for split, rois in expected.items():
        ds = open_store(work / f"results/prepared/{split}.zarr")
        assert sorted({loc.rsplit("_p", 1)[0] for loc in ds["location"].values}) == rois
        assert ds.sizes["time"] == 30 and ds.sizes["y"] == 32
        assert ds["valid_s2"].values.all()
        assert np.isfinite(ds["wind_u"].values).all()  # the synthetic wind table was used
    for slug in ("ROIs1868_119", "ROIs2017_22", "ROIs1158_119", "ROIs1970_22"):
        assert (work / f"results/prepared/rois/{slug}.bad.tsv").is_file()
        log = (work / f"logs/prepare_roi/{slug}.log").read_text()
        assert f"prepared {slug.replace('_', '/')}" in log and '"cloud_classes"' in log
        assert (work / f"benchmarks/prepare_roi/{slug}.tsv").is_file()


def test_four_stages_train_end_to_end(data_run):
    from vcloud.train.checkpoint import load_checkpoint

    work, _, _ = data_run
    for stage in range(4):
        folder = work / f"results/stage{stage}"
        best = load_checkpoint(folder / "best.pt")
        assert best["stage"] == stage and best["best_metric"] == "psnr"
        assert load_checkpoint(folder / "latest.pt")["finished"]
        lines = (folder / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 1 and '"val_psnr"' in lines[0]
        assert (work / f"benchmarks/train_stage{stage}/train_stage{stage}.tsv").is_file()
    report = (work / "results/stage3/pseudo_labels.json").read_text()
    assert '"kept"' in report and '"scored"' in report


def test_every_stage_is_evaluated_on_the_test_split(data_run):
    import json
    import math

    work, _, _ = data_run
    for stage in range(4):
        report = json.loads((work / f"results/eval/stage{stage}.json").read_text())
        assert report["stage"] == stage and report["store"].endswith("test.zarr")
        for protocol in ("fixed", "reference"):
            result = report["protocols"][protocol]
            assert result["samples"] > 0
            for method in ("model", "least_cloudy_date", "median_mosaic"):
                assert all(math.isfinite(v) for v in result[method]["mean"].values()), (stage, protocol, method)
                assert len(result[method]["per_sample"]["psnr"]) == result["samples"]
        log = (work / f"logs/evaluate_stage{stage}/evaluate_stage{stage}.log").read_text()
        assert "| fixed | model |" in log


def test_second_run_has_nothing_to_do(data_run):
    work, _, _ = data_run
    proc = run(["-n", "--configfile", "small.yaml", "-d", str(work)], cwd=work)
    assert "Nothing to be done" in proc.stdout + proc.stderr



def test_rerun_one_stage_by_target(data_run):
    work, _, _ = data_run
    proc = run(["-n", "--configfile", "small.yaml", "-d", str(work), "results/stage2/best.pt", "-R", "train_stage2"], cwd=work)
    text = proc.stdout + proc.stderr
    stats = text.split("Job stats:", 1)[1].split("total", 1)[0]
    jobs = [line.split()[0] for line in stats.splitlines()[3:] if line.strip()]
    assert jobs == ["train_stage2"], text[-2000:]
    before = {n: (work / f"results/stage{n}/best.pt").stat().st_mtime_ns for n in (1, 2)}
    run(["--cores", "2", "--configfile", "small.yaml", "-d", str(work), "results/stage2/best.pt", "-R", "train_stage2"], cwd=work)
    assert (work / "results/stage1/best.pt").stat().st_mtime_ns == before[1]
    assert (work / "results/stage2/best.pt").stat().st_mtime_ns != before[2]


def _edges(mermaid: str) -> set[tuple[str, str]]:
    names = {}
    edges = set()
    for line in mermaid.splitlines():
        line = line.strip()
        if "[" in line and line.endswith("]") and not line.startswith("style"):
            node, label = line[:-1].split("[", 1)
            names[node] = label
        elif "-->" in line:
            a, b = (part.strip() for part in line.split("-->"))
            edges.add((a, b))
    return {(names[a], names[b]) for a, b in edges}


def test_readme_rule_graph_matches_the_workflow():
    proc = run(["--rulegraph", "mermaid-js"], cwd=ROOT)
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Rule graph", 1)[1].split("```mermaid", 1)[1].split("```", 1)[0]
    assert _edges(block) == _edges(proc.stdout)
    assert _edges(block)  # the graph is not empty


def test_wind_scan_config_adds_the_cache_rule_as_input_of_stages_1_to_3(tmp_path):
    models = yaml.safe_load((ROOT / "tests/workflow/tiny_models.yaml").read_text())
    models["data"]["crop"] = None
    models["stage1"]["model"].update(wind_scan=True, wind_sectors=8)
    (tmp_path / "wind_models.yaml").write_text(yaml.safe_dump(models))
    override = {**SMALL, "model_config": str(tmp_path / "wind_models.yaml")}
    (tmp_path / "wind.yaml").write_text(yaml.safe_dump(override))
    proc = run(["-n", "-p", "--configfile", "wind.yaml", "-d", str(tmp_path)], cwd=tmp_path)
    text = proc.stdout + proc.stderr
    assert any(line.split() == ["wind_cache", "1"] for line in text.splitlines()), text[-2000:]
    assert "vcloud wind-cache --out results/wind/scan_orders.npz --grid-h 4 --grid-w 4 --sectors 8" in text
    commands = [line for line in text.splitlines() if "vcloud train --stage" in line]
    assert len(commands) == 4
    for line in commands:
        assert ("--wind-cache results/wind/scan_orders.npz" in line) == ("--stage 0" not in line), line


def test_local_profile_dry_run(tmp_path):
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(SMALL))
    proc = run(["--profile", str(ROOT / "profiles/local"), "-n", "--configfile", "small.yaml", "-d", str(tmp_path)], cwd=tmp_path)
    assert "This was a dry-run" in proc.stdout + proc.stderr
