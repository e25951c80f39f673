"""Run report pieces: training curves, evaluation tables, and the wall/CPU/GPU-hours accounting."""

import csv
import json

import numpy as np
import pytest

from vcloud.errors import BadInputError
from vcloud.export.report import accounting, evaluation_tables, plot_curves, read_metrics, resources_of

BENCH_HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _bench(folder, name, seconds, cpu=0.0):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.tsv").write_text(BENCH_HEADER + f"{seconds}\t0:00:00\t1\t1\t1\t1\t0\t0\t50\t{cpu}\n")


def test_read_metrics_keeps_the_last_record_of_a_repeated_epoch(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"epoch": 0, "loss": 3.0}, {"epoch": 1, "loss": 2.0}, {"epoch": 1, "loss": 1.5}, {"epoch": 2, "loss": 1.0}]
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")  # a resume rewrote epoch 1
    assert [r["loss"] for r in read_metrics(path)] == [3.0, 1.5, 1.0]
    path.write_text('{"epoch": 0}\nnot json\n')
    with pytest.raises(BadInputError, match=r"metrics.jsonl:2: not an epoch record"):
        read_metrics(path)
    with pytest.raises(BadInputError, match="no such metrics file"):
        read_metrics(tmp_path / "missing.jsonl")


def test_plot_curves_draws_each_recorded_metric_and_marks_the_missing_one(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from PIL import Image

    figures, close = [], plt.close
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to look at what it draws
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps({"epoch": e, "loss": 1 / (e + 1), "val_psnr": 20 + e}) for e in range(3)))
    plot_curves(path, tmp_path / "out/stage1.png", title="stage1")  # no samples_per_s
    (fig,) = figures
    loss, psnr, speed = fig.axes
    assert loss.lines[0].get_xydata().tolist() == [[1, 1.0], [2, 0.5], [3, 1 / 3]]  # epochs from 1
    assert psnr.lines[0].get_xydata().tolist() == [[1, 20], [2, 21], [3, 22]]
    assert [ax.get_title() for ax in fig.axes] == ["training loss", "validation PSNR (dB)", "samples/s"]
    assert not speed.lines and [t.get_text() for t in speed.texts] == ["not recorded"]
    assert fig.get_suptitle() == f"stage1 (3 epochs, {path})"
    close(fig)
    image = Image.open(tmp_path / "out/stage1.png")
    assert image.format == "PNG" and image.size == (1100, 320)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["stage1.png"]  # no temp file left
    first = (tmp_path / "out/stage1.png").read_bytes()
    # a validated starting point (epoch -1, no loss) is drawn at 0 and not counted as an epoch
    start = tmp_path / "start.jsonl"
    start.write_text(json.dumps({"epoch": -1, "val_psnr": 19.5}) + "\n" + path.read_text())
    plot_curves(start, tmp_path / "start.png", title="stage2")
    loss, psnr, _ = figures[-1].axes
    assert psnr.lines[0].get_xydata().tolist() == [[0, 19.5], [1, 20], [2, 21], [3, 22]]
    assert loss.lines[0].get_xydata().tolist()[0] == [1, 1.0]
    assert figures[-1].get_suptitle() == f"stage2 (3 epochs + the start at 0, {start})"
    close(figures[-1])
    plot_curves(path, tmp_path / "out/stage1.png", title="stage1")
    assert (tmp_path / "out/stage1.png").read_bytes() == first  # reproducible: no timestamp inside


def test_accounting_turns_benchmarks_into_wall_cpu_and_gpu_hours(tmp_path):
    bench = tmp_path / "benchmarks"
    _bench(bench / "prepare_roi", "ROIs1_1", 360, cpu=300)
    _bench(bench / "prepare_roi", "ROIs1_2", 720, cpu=600)
    _bench(bench / "train_stage1", "train_stage1", 1800, cpu=1000)
    _bench(bench / "evaluate_stage1", "evaluate_stage1", 36)
    (bench / "empty_rule").mkdir()  # no benchmark yet: not counted
    resources = {
        "prepare_roi": {"threads": 2, "gpus": 0, "nodes": 1},
        "train_stage1": {"threads": 56, "gpus": 8, "nodes": 2},
        "evaluate_stage1": {"threads": 1},  # gpus and nodes default to 0 and 1
    }
    costs = accounting(bench, resources, tsv=tmp_path / "acc.tsv", page=tmp_path / "acc.html")
    by_rule = {c.rule: c for c in costs}
    assert sorted(by_rule) == ["evaluate_stage1", "prepare_roi", "train_stage1"]
    prep, train, ev = by_rule["prepare_roi"], by_rule["train_stage1"], by_rule["evaluate_stage1"]
    assert (prep.jobs, prep.stage, prep.wall_h, prep.cpu_h, prep.gpu_h) == (2, "data", 0.3, 0.6, 0.0)
    assert (train.stage, train.gpus, train.wall_h, train.cpu_h, train.gpu_h) == ("stage1", 16, 0.5, 28.0, 8.0)
    assert (ev.stage, ev.threads, ev.wall_h, ev.gpu_h) == ("stage1", 1, 0.01, 0.0)
    rows = list(csv.DictReader(open(tmp_path / "acc.tsv"), delimiter="\t"))
    stage1 = next(r for r in rows if r["rule"] == "(all rules)" and r["stage"] == "stage1")
    assert (stage1["wall_s"], stage1["gpu_h"], stage1["cpu_h"]) == ("1836.00", "8.0000", "28.0100")
    total = rows[-1]
    assert (total["rule"], total["jobs"], total["wall_s"], total["cpu_time_h"]) == ("(total)", "4", "2916.00", "0.5278")
    assert "<td>8.0000</td>" in (tmp_path / "acc.html").read_text()


def test_accounting_counts_a_rule_without_resources_as_one_thread_and_names_it(tmp_path):
    _bench(tmp_path / "b/wind_cache", "x", 7200)
    (cost,) = accounting(tmp_path / "b", {}, tsv=tmp_path / "a.tsv", page=tmp_path / "a.html")
    assert (cost.rule, cost.stage, cost.threads, cost.cpu_h, cost.gpu_h, cost.assumed) == (
        "wind_cache",
        "data",
        1,
        2.0,
        0.0,
        True,
    )
    assert "No resources entry for wind_cache" in (tmp_path / "a.html").read_text()


def test_accounting_names_a_bad_benchmark_file(tmp_path):
    (tmp_path / "c/synth_raw").mkdir(parents=True)
    (tmp_path / "c/synth_raw/synth_raw.tsv").write_text("wall\n1\n")
    with pytest.raises(BadInputError, match=r"synth_raw.tsv: not a snakemake benchmark file"):
        accounting(tmp_path / "c", {"synth_raw": {"threads": 1}}, tsv=tmp_path / "a.tsv", page=tmp_path / "a.html")
    assert not (tmp_path / "a.tsv").exists()


def test_resources_of_is_the_entry_named_like_the_rule():
    resources = {"evaluate_stage3": {"threads": 1}, "train_stage0": {"threads": 2}}
    assert resources_of("evaluate_stage3", resources) == {"threads": 1}
    assert resources_of("train_stage0", resources) == {"threads": 2}
    assert resources_of("evaluate_stage0", resources) is None  # no family fallback
    assert resources_of("wind_cache", resources) is None


def test_evaluation_tables_show_means_and_classes_of_every_stage(tmp_path):
    method = {
        "mean": {"psnr": 31.234, "ssim": 0.9, "sam": 5.0, "mae": 0.02, "rmse": 0.03},
        "by_class": {"thick": {"psnr": 29.5, "samples": 2}},
    }
    for stage in (0, 1):
        report = {
            "stage": stage,
            "store": "test.zarr",
            "protocols": {
                "fixed": {"samples": 2, "model": method, "least_cloudy_date": method, "median_mosaic": method}
            },
        }
        (tmp_path / f"stage{stage}.json").write_text(json.dumps(report))
    evaluation_tables([tmp_path / "stage0.json", tmp_path / "stage1.json"], tmp_path / "eval.html")
    page = (tmp_path / "eval.html").read_text()
    assert "<h2>stage 0</h2>" in page and "<h2>stage 1</h2>" in page
    assert "<td class=l>fixed</td><td class=l>model</td><td>2</td><td>31.23</td>" in page
    assert "<td class=l>thick</td><td>2</td><td>29.50</td>" in page
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(BadInputError, match="bad.json: not an evaluation report"):
        evaluation_tables([tmp_path / "bad.json"], tmp_path / "eval.html")


def test_evaluation_tables_show_the_protocol_the_new_baseline_and_paired_errors(tmp_path):
    from vcloud.evaluation.stats import paired_report

    def method(psnr):
        return {
            "mean": {"psnr": float(np.mean(psnr)), "ssim": 0.9, "sam": 5.0, "mae": 0.02, "rmse": 0.03},
            "by_class": {},
            "per_sample": {"psnr": psnr, "ssim": [0.9, 0.8, 0.7]},
        }

    result = {
        "samples": 3,
        "cloud_class": ["thin", "thin", "thick"],
        "location": [0, 0, 1],
        "model": method([30.0, 32.0, 34.0]),
        "nearest_clear_date": method([29.0, 30.0, 30.0]),
    }
    result["paired"] = paired_report(result, others=["nearest_clear_date"])
    setup = {
        "protocol": "uncrtaints",
        "dates": 3,
        "region": "europa",
        "min_cov": 0.0,
        "max_cov": 1.0,
        "pairs": "computed",
        "target_in_inputs": 1,
        "samples": 3,
    }
    report = {"stage": 1, "store": "test.zarr", "protocols": {"uncrtaints": {"protocol": setup, **result}}}
    (tmp_path / "stage1.json").write_text(json.dumps(report))
    evaluation_tables([tmp_path / "stage1.json"], tmp_path / "eval.html", markdown=tmp_path / "eval.md")
    page = (tmp_path / "eval.html").read_text()
    setup_line = "uncrtaints: T=3, region europa, coverage [0, 1], pairs computed, target among the inputs in 1 of 3"
    assert f"<li>{setup_line}</li>" in page
    assert "<td class=l>uncrtaints</td><td class=l>nearest_clear_date</td><td>3</td><td>29.67</td>" in page
    # differences 1, 2, 4: mean 2.33, paired SE std([1, 2, 4], ddof=1) / sqrt(3) = 0.88; by location
    # (0: 1, 2; 1: 4) sqrt(2 * ((-1.33 - 0.33)^2 + 1.67^2)) / 3 = 1.11
    row = (
        "<td class=l>uncrtaints</td><td class=l>model - nearest_clear_date</td><td class=l>all</td><td>3</td>"
        "<td>2</td><td>+2.33 ± 0.88</td><td>1.11</td><td>+0.000 ± 0.000</td>"
    )
    assert row in page
    assert "<td class=l>thin</td><td>2</td><td>1</td><td>+1.50 ± 0.50</td><td>-</td>" in page  # 1 location: no SE
    text = (tmp_path / "eval.md").read_text()
    assert f"- {setup_line}" in text
    assert "| uncrtaints | model - nearest_clear_date | all | 3 | 2 | +2.33 ± 0.88 | 1.11 |" in text


def test_cli_accounting_rejects_resources_that_are_not_json(tmp_path, capsys):
    from vcloud.cli import main

    status = main(
        [
            "accounting",
            "--benchmarks",
            str(tmp_path),
            "--resources",
            "{not json",
            "--tsv",
            str(tmp_path / "a.tsv"),
            "--html",
            str(tmp_path / "a.html"),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert status == 2 and err.startswith("vcloud accounting: error: --resources: not a JSON object")
    assert len(err.splitlines()) == 1


def test_accounting_bills_what_lumi_bills_for_each_jobs_resources(tmp_path):
    """gpu_h follows the job's billing entry (computed from its actual resources by
    vcloud.runtime.billing.billing), not gpus x hours; CPU rules get billed core-hours."""
    import math
    from pathlib import Path

    from vcloud.runtime.billing import billing
    from vcloud.runtime.cluster import Cluster, RuleResources
    from vcloud.runtime.profile import load_workflow_config

    lumi = Cluster.from_config(load_workflow_config(Path(__file__).resolve().parents[2] / "config" / "lumi.yaml"))
    bench = tmp_path / "benchmarks"
    _bench(bench / "train_stage1", "train_stage1", 7200)  # 2 h
    _bench(bench / "prepare_roi", "x", 3600)
    small_g, small = lumi.partitions["small-g"], lumi.partitions["small"]
    train = RuleResources("train_stage1", 4320, 4 * 60000, 7, "small-g", 4, 1, 7)
    prep = RuleResources("prepare_roi", 240, 16000, 4, "small", 0, 1, 7)
    resources = {}
    for res, part in ((train, small_g), (prep, small)):
        bill = billing(res, part, lumi)  # LUMI's slices, from its site file
        resources[res.rule] = {
            "threads": res.threads,
            "gpus": res.gpus,
            "nodes": 1,
            "billing": {"unit": bill.unit, "per_hour": bill.per_hour},
        }
    costs = {c.rule: c for c in accounting(bench, resources, tsv=tmp_path / "a.tsv", page=tmp_path / "a.html")}
    # LUMI: 0.5 x max(ceil(28 / 8), ceil(240000 / 65536), 4 GCDs) = 2 GPU-h per hour, for 2 h.
    assert costs["train_stage1"].gpu_h == 0.5 * max(math.ceil(28 / 8), math.ceil(240000 / 65536), 4) * 2
    assert costs["prepare_roi"].billed_core_h == max(4, math.ceil(16000 / 2048)) * 1 and costs["prepare_roi"].gpu_h == 0
    rows = list(csv.DictReader(open(tmp_path / "a.tsv"), delimiter="\t"))
    assert rows[-1]["gpu_h"] == f"{costs['train_stage1'].gpu_h:.4f}"
    assert "billing.md" in (tmp_path / "a.html").read_text()
    assert (rows[0]["billed"], rows[0]["billed_unit"]) == ("8.0000", "core-h")  # prepare_roi
    assert rows[-1]["billed_unit"] == "mixed" and rows[-1]["billed"] == "4.0000 GPU-h + 8.0000 core-h"
    resources["train_stage1"]["billing"] = {"unit": "", "per_hour": 1}
    with pytest.raises(BadInputError, match="train_stage1: billing must be"):
        accounting(bench, resources, tsv=tmp_path / "b.tsv", page=tmp_path / "b.html")


def test_accounting_bills_in_the_sites_own_unit(tmp_path):
    """Saga bills GPU and CPU jobs in billing units (weighted_max): the billed column carries
    them; gpu_h stays GPU-hours of the job's GPUs, and nothing is booked as core-h."""
    bench = tmp_path / "benchmarks"
    _bench(bench / "train_stage1", "train_stage1", 7200)  # 2 h
    _bench(bench / "prepare_roi", "x", 3600)
    resources = {
        "train_stage1": {"threads": 6, "gpus": 1, "nodes": 1, "billing": {"unit": "BU-h", "per_hour": 8}},
        "prepare_roi": {"threads": 8, "gpus": 0, "nodes": 1, "billing": {"unit": "BU-h", "per_hour": 8.2}},
    }
    costs = {c.rule: c for c in accounting(bench, resources, tsv=tmp_path / "a.tsv", page=tmp_path / "a.html")}
    assert costs["train_stage1"].billed == 16 and costs["train_stage1"].gpu_h == 2
    assert costs["prepare_roi"].billed_core_h == 0 and costs["prepare_roi"].gpu_h == 0
    rows = list(csv.DictReader(open(tmp_path / "a.tsv"), delimiter="\t"))
    assert (rows[-1]["billed"], rows[-1]["billed_unit"]) == ("24.2000", "BU-h")  # 16 + 8.2, one unit
