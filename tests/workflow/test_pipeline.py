"""The whole DAG through the snakemake command line, as a user runs it (one shared real run)."""

import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from tests.workflow.snakemake_run import ROOT, SMALL, run
from vcloud.data.store import open_store

pytestmark = pytest.mark.workflow


def test_lint_is_clean():
    proc = run(["--lint"], cwd=ROOT)
    assert "Congratulations, your workflow is in a good condition" in proc.stdout + proc.stderr


def test_snakefmt_is_clean():
    files = [ROOT / "Snakefile", *sorted((ROOT / "workflow/rules").glob("*.smk"))]
    proc = subprocess.run(
        [sys.executable, "-m", "snakefmt", "--check", *map(str, files)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_bad_config_key_stops_the_dry_run_with_its_name(tmp_path):
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"data": {"on_bad_imagee": "skip"}}))
    proc = run(["-n", "--configfile", "bad.yaml", "-d", str(tmp_path)], cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "unknown key data.on_bad_imagee" in proc.stdout + proc.stderr


@pytest.fixture
def data_run(pipeline_run):
    """The session's real run of the whole workflow (tests/conftest.py), shared with tests/browser."""
    return pipeline_run


def test_dry_run_plans_one_prepare_job_per_roi(data_run):
    _, dry, _ = data_run
    text = dry.stdout + dry.stderr
    # The synthetic ROIs lie in 4 archives of each kind (asiaEast_test, africa_test, europa, africa).
    plan = [("synth_raw", 1), ("index_archive", 8), ("prepare_roi", 4), ("assemble_split", 3)]
    plan += [(f"train_stage{n}", 1) for n in range(4)] + [(f"evaluate_stage{n}", 1) for n in range(4)]
    plan += [("fixed_protocol", 1), ("export_viewer", 1), ("report_curves", 1), ("report_tables", 1)]
    plan += [("accounting", 1)]
    for rule, count in plan:
        assert any(line.split() == [rule, str(count)] for line in text.splitlines()), text[-2000:]


def test_data_part_writes_split_stores_logs_and_benchmarks(data_run):
    work, _, _ = data_run
    expected = {"train": ["ROIs1970_119", "ROIs1970_21"], "val": ["ROIs2017_22"], "test": ["ROIs1868_119"]}
    for split, rois in expected.items():
        ds = open_store(work / f"results/prepared/{split}.zarr")
        assert sorted({loc.rsplit("_p", 1)[0] for loc in ds["location"].values}) == rois
        assert ds.sizes["time"] == 30 and ds.sizes["y"] == 32
        assert ds["valid_s2"].values.all()
        assert np.isfinite(ds["wind_u"].values).all()  # the synthetic wind table was used
    # The default pipeline reads the synthetic data as downloaded: archives and their indexes.
    assert (work / "resources/sen12mscrts_synth/s2_europa.tar.gz").is_file()
    assert (work / "results/prepared/index/s2_europa.tar.gz.vcloud-index").is_file()
    assert not (work / "resources/sen12mscrts_synth/ROIs1970").exists()
    for slug in ("ROIs1868_119", "ROIs2017_22", "ROIs1970_119", "ROIs1970_21"):
        assert (work / f"results/prepared/rois/{slug}.bad.tsv").is_file()
        log = (work / f"logs/prepare_roi/{slug}.log").read_text()
        assert f"prepared {slug.replace('_', '/')}" in log and '"cloud_classes"' in log
        assert (work / f"benchmarks/prepare_roi/{slug}.tsv").is_file()


def test_four_stages_train_end_to_end(data_run):
    import json

    from vcloud.train.checkpoint import load_checkpoint

    work, _, _ = data_run
    for stage in range(4):
        folder = work / f"results/stage{stage}"
        best = load_checkpoint(folder / "best.pt")
        assert best["stage"] == stage and best["best_metric"] == "psnr"
        assert load_checkpoint(folder / "latest.pt")["finished"]
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        # stages 2 and 3 validate their starting point first (row "epoch": -1, the score to beat)
        assert [r["epoch"] for r in rows] == ([-1, 0] if stage in (2, 3) else [0]), rows
        assert all("val_psnr" in r for r in rows)
        assert (work / f"benchmarks/train_stage{stage}/train_stage{stage}.tsv").is_file()
    report = json.loads((work / "results/stage3/pseudo_labels.json").read_text())
    assert report["kept"] + report["rejected"] == report["scored"] == len(report["samples"])
    assert set(report["validation_check"]) == {"kept", "rejected"}


def test_every_stage_is_evaluated_on_the_test_split(data_run):
    import json
    import math

    work, _, _ = data_run
    for stage in range(4):
        report = json.loads((work / f"results/eval/stage{stage}.json").read_text())
        assert report["stage"] == stage and report["store"].endswith("test.zarr")
        for protocol in ("fixed", "reference", "uncrtaints"):
            result = report["protocols"][protocol]
            assert result["samples"] > 0 and result["protocol"]["protocol"] == protocol
            for method in ("model", "least_cloudy_date", "median_mosaic", "nearest_clear_date"):
                assert all(math.isfinite(v) for v in result[method]["mean"].values()), (stage, protocol, method)
                assert len(result[method]["per_sample"]["psnr"]) == result["samples"]
            assert result["paired"]["nearest_clear_date"]["overall"]["psnr"]["samples"] == result["samples"]
        setup = report["protocols"]["uncrtaints"]["protocol"]
        assert (setup["dates"], setup["region"], setup["pairs"]) == (3, "all", "computed")
        log = (work / f"logs/evaluate_stage{stage}/evaluate_stage{stage}.log").read_text()
        assert "| fixed | model |" in log and "| uncrtaints | model - nearest_clear_date | all |" in log


def test_viewer_is_exported_from_the_test_split(data_run):
    import json
    import re

    work, _, _ = data_run
    viewer = work / "results/viewer"
    page = (viewer / "index.html").read_text()
    data = json.loads(page.split('id="viewer-data">', 1)[1].split("</script>", 1)[0])
    fixed = json.loads((work / "results/eval/stage3.json").read_text())["protocols"]["fixed"]
    assert len(data["samples"]) == min(12, fixed["samples"])  # config viewer.samples
    images = sorted(p.name for p in (viewer / "images").glob("*.png"))  # not .snakemake_timestamp
    assert images == sorted(name.split("/")[-1] for s in data["samples"] for name in s["images"].values())
    assert len(images) == 9 * len(data["samples"])  # nine layers a sample
    for sample in data["samples"]:  # viewer sample i is evaluation sample i (same clouds)
        assert sample["cloud_class"] == fixed["cloud_class"][sample["index"]]
    assert not re.search(r"https?://", page, re.IGNORECASE)  # nothing online
    assert (viewer / "thumbnails.png").stat().st_size > 0
    assert (work / "benchmarks/export_viewer/export_viewer.tsv").is_file()


def test_viewer_export_is_byte_identical_across_runs(data_run, tmp_path):
    work, _, _ = data_run
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vcloud.cli",
            "export-viewer",
            "--store",
            "results/prepared/test.zarr",
            *[a for n in range(4) for a in (f"--stage{n}", f"results/stage{n}/best.pt")],
            "--config",
            SMALL["model_config"],
            "--out",
            str(tmp_path / "again"),
            "--samples",
            "12",
            "--seed",
            "0",
            "--wind-cache",
            "results/wind/scan_orders.npz",
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        # The rule ran with 1 thread (snakemake sets OMP_NUM_THREADS); float sums in the wind
        # mixer's layers differ in the last bit between thread counts, so rerun with the same.
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    first = sorted(p.relative_to(work / "results/viewer") for p in (work / "results/viewer").rglob("*.*ml"))
    first += sorted(p.relative_to(work / "results/viewer") for p in (work / "results/viewer").rglob("*.png"))
    again = sorted(p.relative_to(tmp_path / "again") for p in (tmp_path / "again").rglob("*.*ml"))
    again += sorted(p.relative_to(tmp_path / "again") for p in (tmp_path / "again").rglob("*.png"))
    assert len(first) > 2 + 9 and not list((tmp_path / "again").glob(".staging-*"))
    assert first == again
    for name in first:
        assert (work / "results/viewer" / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name


def test_report_inputs_curves_tables_and_accounting(data_run):
    import csv

    work, _, _ = data_run
    for stage in range(4):
        assert (work / f"results/report/curves/stage{stage}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tables = (work / "results/report/evaluation.html").read_text()
    assert all(f"<h2>stage {n}</h2>" in tables for n in range(4))
    rows = list(csv.DictReader(open(work / "results/report/accounting.tsv"), delimiter="\t"))
    rules = {r["rule"] for r in rows}
    assert {"prepare_roi", "train_stage2", "evaluate_stage3", "export_viewer", "report_tables"} <= rules
    assert all(float(r["gpu_h"]) == 0.0 for r in rows)  # the default config has no GPU
    assert float(rows[-1]["wall_s"]) > 0 and rows[-1]["rule"] == "(total)"


@pytest.mark.parametrize("suffix", ["html", "zip"])
def test_snakemake_report_builds(data_run, suffix):
    import zipfile

    work, _, _ = data_run
    target = work / f"report.{suffix}"
    run(["--report", target.name, "--configfile", "small.yaml", "-d", str(work)], cwd=work)
    if suffix == "zip":
        names = zipfile.ZipFile(target).namelist()
        for name in ("thumbnails.png", "stage0.png", "stage3.png", "evaluation.html", "accounting.html", "report.html"):
            assert any(n.endswith("/" + name) for n in names), (name, names)
    else:
        text = target.read_text()
        assert "accounting.html" in text and "thumbnails.png" in text and "results/viewer/index.html" in text


def test_second_run_has_nothing_to_do(data_run):
    work, _, _ = data_run
    proc = run(["-n", "--configfile", "small.yaml", "-d", str(work)], cwd=work)
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_rerun_one_stage_by_target(data_run):
    work, _, _ = data_run
    proc = run(
        ["-n", "--configfile", "small.yaml", "-d", str(work), "results/stage2/best.pt", "-R", "train_stage2"], cwd=work
    )
    text = proc.stdout + proc.stderr
    stats = text.split("Job stats:", 1)[1].split("total", 1)[0]
    jobs = [line.split()[0] for line in stats.splitlines()[3:] if line.strip()]
    assert jobs == ["train_stage2"], text[-2000:]
    before = {n: (work / f"results/stage{n}/best.pt").stat().st_mtime_ns for n in (1, 2)}
    run(
        ["--cores", "2", "--configfile", "small.yaml", "-d", str(work), "results/stage2/best.pt", "-R", "train_stage2"],
        cwd=work,
    )
    assert (work / "results/stage1/best.pt").stat().st_mtime_ns == before[1]
    assert (work / "results/stage2/best.pt").stat().st_mtime_ns != before[2]


def _edges(mermaid: str) -> set[tuple[str, str]]:
    """(rule, rule that takes its output) from snakemake's mermaid (`id3[name]` nodes, one edge a
    line) or the README's (rule names as nodes, `a --> b & c`)."""
    names = {}
    edges = set()
    for line in mermaid.splitlines():
        line = line.strip()
        if "[" in line and line.endswith("]") and not line.startswith("style"):
            node, label = line[:-1].split("[", 1)
            names[node] = label
        elif "-->" in line:
            sources, targets = line.split("-->")
            edges |= {(a.strip(), b.strip()) for a in sources.split("&") for b in targets.split("&")}
    return {(names.get(a, a), names.get(b, b)) for a, b in edges}


def _one_line_per_rule(edges: set[tuple[str, str]]) -> str:
    """The README's form of the graph: each rule (in dependency order) with the rules that take its
    output."""
    rules = sorted({rule for edge in edges for rule in edge})
    order = []
    while len(order) < len(rules):
        order.append(next(r for r in rules if r not in order and {a for a, b in edges if b == r} <= set(order)))
    lines = ["flowchart TB"]
    for rule in order:
        takers = sorted((b for a, b in edges if a == rule), key=order.index)
        if takers:
            lines.append(f"    {rule} --> {' & '.join(takers)}")
    return "\n".join(lines)


@pytest.mark.parametrize("page", ["README.md", "docs/workflow.md"])
def test_the_rule_graph_in_the_docs_matches_the_workflow(page):
    proc = run(["--rulegraph", "mermaid-js"], cwd=ROOT)
    workflow = _edges(proc.stdout)
    assert workflow  # the graph is not empty
    text = (ROOT / page).read_text()
    block = text.split("```mermaid", 1)[1].split("```", 1)[0]
    assert _edges(block) == workflow, (
        f"{page}: the rule graph is out of date; the workflow's:\n{_one_line_per_rule(workflow)}"
    )


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
    proc = run(
        ["--profile", str(ROOT / "profiles/local"), "-n", "--configfile", "small.yaml", "-d", str(tmp_path)],
        cwd=tmp_path,
    )
    assert "This was a dry-run" in proc.stdout + proc.stderr
