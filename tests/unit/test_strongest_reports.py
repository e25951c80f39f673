"""Every report opens with the model against the strongest simple answer: vcloud report-tables
(HTML and Markdown), vcloud compare-stages, vcloud compare (JSON and Markdown) and the viewer's
data, on hand-made reports whose strongest baseline, difference, interval and wins are worked out
by hand; and the command docs/evaluation.md gives for the tables, run as it is written."""

from __future__ import annotations

import glob
import html
import json
import re
import shlex
from pathlib import Path

import pytest

from vcloud.cli import main
from vcloud.evaluation.compare import compare_runs, headline, runs_markdown, strongest_of

ROOT = Path(__file__).resolve().parents[2]

# The fixed protocol, 4 samples at locations 0, 0, 1, 1. The strongest simple answer is the series
# clear-pixel median (mean 31.5 against 30 and 31). model - it: -1, +1, -1, +3, mean +0.5, wins 2 of 4;
# e = d - 0.5 = -1.5, 0.5, -1.5, 2.5, S_0 = -1, S_1 = 1: se_location = sqrt(2 / 1 * 2) / 4 = 0.5,
# 1 degree of freedom, t = 12.706: [+0.5 - 6.353, +0.5 + 6.353].
FIXED_LINE = (
    "model - series_clear_median (the strongest simple answer): +0.50 dB PSNR [-5.85, +6.85] at 95%, "
    "wins 2 of 4: the model does not beat it (the interval holds zero)"
)
# The reference protocol, 3 samples at 3 locations: the series mosaic (33) is the strongest; model - it
# 2, 3, 4, mean 3, se = 1 / sqrt 3 = 0.577 (one sample per location: the clustered SE is the paired
# one), 2 degrees of freedom, t = 4.303: [+0.52, +5.48], wins 3 of 3.
REFERENCE_LINE = (
    "model - series_mosaic (the strongest simple answer): +3.00 dB PSNR [+0.52, +5.48] at 95%, "
    "wins 3 of 3: the model beats it"
)
FALLBACKS = "context policy fallbacks: beyond_window 2 (of 3 samples)"


def method(psnr: list[float]) -> dict:
    mean = sum(psnr) / len(psnr)
    return {
        "mean": {"psnr": mean, "ssim": 0.9, "sam": 5.0, "mae": 0.02, "rmse": 0.03},
        "by_class": {},
        "per_sample": {"psnr": psnr},
    }


def protocols(model_shift: float = 0.0) -> dict:
    """A report's protocols as vcloud evaluate writes them, less what the tables do not read; no
    `strongest` (a report of before it): the readers work it out from the per-sample values."""
    fixed = {
        "protocol": {"protocol": "fixed", "dates": 4},
        "samples": 4,
        "cloud_class": ["thin", "thick", "thin", "thick"],
        "location": [0, 0, 1, 1],
        "model": method([31.0 + model_shift, 33.0 + model_shift, 30.0 + model_shift, 34.0 + model_shift]),
        "least_cloudy_date": method([30.0, 30.0, 30.0, 30.0]),
        "series_clear_median": method([32.0, 32.0, 31.0, 31.0]),
        "series_least_cloudy": method([31.0, 31.0, 31.0, 31.0]),
    }
    reference = {
        "protocol": {"protocol": "reference", "dates": 4},
        "samples": 3,
        "cloud_class": ["thin", "thin", "thick"],
        "location": [0, 1, 2],
        "context": {"dates": [[0, 1], [0, 2], [1, 2]], "fallback": [None, "beyond_window", "beyond_window"]}
        | {"fallbacks": {"beyond_window": 2}},
        "model": method([35.0 + model_shift, 36.0 + model_shift, 37.0 + model_shift]),
        "nearest_clear_date": method([30.0, 31.0, 32.0]),
        "series_mosaic": method([33.0, 33.0, 33.0]),
    }
    return {"fixed": fixed, "reference": reference}


def write_report(path: Path, stage: int, protocols_: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"stage": stage, "store": "test.zarr", "protocols": protocols_}))
    return path


def test_the_strongest_is_read_from_the_report_or_worked_out_as_scoring_does():
    from vcloud.evaluation import scoring

    fixed = protocols()["fixed"]
    got = strongest_of(fixed)
    assert got["baseline"] == "series_clear_median" and got["difference"] == pytest.approx(0.5)
    assert (
        got["wins"] == 2 and got["samples"] == 4 and got["ci"] == pytest.approx([0.5 - 6.3531, 0.5 + 6.3531], abs=1e-3)
    )
    assert headline(got) == FIXED_LINE
    # The scorer's own (evaluate's): the same baseline, numbers and words.
    written = {**fixed, "strongest": scoring.strongest(fixed, [n for n in scoring.BASELINES if n in fixed])}
    assert written["strongest"]["baseline"] == "series_clear_median"
    assert scoring.headline(written) == headline(strongest_of(written)) == FIXED_LINE
    # A report's own `strongest` is what is read, never recomputed.
    assert strongest_of({**fixed, "strongest": {"baseline": "x"}}) == {"baseline": "x"}
    assert strongest_of({**fixed, "strongest": None}) is None
    assert strongest_of({"model": fixed["model"], "location": [0, 0, 1, 1]}) is None  # no baseline at all


def test_report_tables_open_with_every_stage_against_the_strongest_and_count_fallbacks(tmp_path):
    one = write_report(tmp_path / "stage1.json", 1, protocols())
    two = write_report(tmp_path / "stage2.json", 2, protocols(model_shift=10.0))
    page, md = tmp_path / "evaluation.html", tmp_path / "evaluation.md"
    assert main(["report-tables", "--out", str(page), "--markdown", str(md), str(one), str(two)]) == 0
    text = md.read_text()
    assert text.startswith("## Against the strongest simple answer\n\n")
    opening = text.split("\n\n")[1].splitlines()
    assert opening[0] == f"- stage 1, fixed: {FIXED_LINE}"
    assert opening[1] == f"- stage 1, reference: {REFERENCE_LINE}; {FALLBACKS}"
    # Stage 2 is 10 dB better on every sample: the same intervals moved by 10, every sample won.
    assert opening[2].startswith("- stage 2, fixed: model - series_clear_median (the strongest simple answer): +10.50")
    assert opening[2].endswith("wins 4 of 4: the model beats it")
    assert len(opening) == 4 and text.index("## stage 1") > text.index(opening[3])
    body = page.read_text()
    top = body.index('<ul id="strongest">')
    assert top < body.index("<h2>stage 1</h2>") and top < body.index("Metrics on the S2 0..1 scale")
    assert f"<li>{html.escape(f'stage 1, fixed: {FIXED_LINE}')}</li>" in body
    assert html.escape(FALLBACKS) in body
    # What the page says of the baselines is what the evaluation does.
    from vcloud.evaluation.series_baselines import NAMES as SERIES_NAMES

    for name in SERIES_NAMES:
        assert name in body
    assert "least-cloudy date = truth, the T input dates nearest to it" not in body


def test_a_report_without_baselines_opens_with_nothing_it_cannot_say(tmp_path):
    report = {"fixed": {"samples": 2, "location": [0, 1], "model": method([30.0, 31.0])}}
    path = write_report(tmp_path / "stage1.json", 1, report)
    assert (
        main(["report-tables", "--out", str(tmp_path / "e.html"), "--markdown", str(tmp_path / "e.md"), str(path)]) == 0
    )
    assert "strongest" not in (tmp_path / "e.md").read_text()


def test_compare_stages_opens_with_each_stage_against_the_strongest(tmp_path):
    one = write_report(tmp_path / "stage1.json", 1, protocols())
    written = protocols(model_shift=10.0)
    written["fixed"]["strongest"] = {**strongest_of(written["fixed"]), "baseline": "as_written"}  # read as written
    two = write_report(tmp_path / "stage2.json", 2, written)
    out, md = tmp_path / "stages.json", tmp_path / "stages.md"
    assert main(["compare-stages", "--out", str(out), "--markdown", str(md), str(one), str(two)]) == 0
    stages = json.loads(out.read_text())
    fixed = stages["protocols"]["fixed"]
    assert fixed["strongest"]["1"]["baseline"] == "series_clear_median" and fixed["strongest"]["1"]["wins"] == 2
    assert fixed["strongest"]["2"]["baseline"] == "as_written"
    assert stages["protocols"]["reference"]["strongest"]["1"]["difference"] == pytest.approx(3.0)
    assert "strongest" not in stages["protocols"]["natural"]  # pooled protocols: no common baselines
    assert fixed["difference"]["2 - 1"]["difference"] == pytest.approx(10.0)  # what it had stays
    lines = md.read_text().splitlines()
    assert lines[0] == "Against the strongest simple answer:"
    assert lines[2] == f"- stage 1, fixed: {FIXED_LINE}"
    assert lines[3] == f"- stage 1, reference: {REFERENCE_LINE}"
    assert lines[4].startswith("- stage 2, fixed: model - as_written (the strongest simple answer): +10.50 dB")
    assert lines[5].startswith("- stage 2, reference: model - series_mosaic")
    assert lines[7].startswith("| protocol | samples | stage 1 | stage 2 |")


def run_report(path: Path, stage: int, model: list[float], baselines: dict[str, list[float]]) -> Path:
    """One run's report of the fixed protocol on 2 samples at locations 0 and 1."""
    result = {
        "protocol": {"protocol": "fixed", "dates": 4},
        "samples": 2,
        "cloud_class": ["thin", "thin"],
        "location": [0, 1],
        "model": method(model),
        **{name: method(values) for name, values in baselines.items()},
    }
    return write_report(path, stage, {"fixed": result})


@pytest.fixture
def runs(tmp_path):
    """base and s1 under seeds 0 and 1, stage 2. Every report's strongest is the series clear-pixel
    median (31) but s1 seed 0's, where the least-cloudy date scores 33; over both seeds it scores 30.5
    and the median stays the strongest. s1 seed 0 also has a series mosaic of 40 that seed 1 lacks:
    not a candidate."""
    median, cloudy = {"series_clear_median": [31.0, 31.0]}, {"least_cloudy_date": [29.0, 29.0]}
    return [
        ("base", 0, run_report(tmp_path / "b0.json", 2, [30.0, 32.0], {**cloudy, **median})),
        ("base", 1, run_report(tmp_path / "b1.json", 2, [32.0, 34.0], {**cloudy, **median})),
        (
            "s1",
            0,
            run_report(
                tmp_path / "s0.json",
                2,
                [35.0, 35.2],
                {"least_cloudy_date": [33.0, 33.0], **median, "series_mosaic": [40.0, 40.0]},
            ),
        ),
        ("s1", 1, run_report(tmp_path / "s1.json", 2, [35.0, 35.2], {"least_cloudy_date": [28.0, 28.0], **median})),
    ]


# base: model - median per seed 0 and 2 (se_seed 1); seed-averaged 0, 2 (se_location 1); se sqrt 2,
# Welch-Satterthwaite 2 degrees of freedom, t = 4.303: 1 ± 6.085; wins 1 of 2 (33 > 31; 31 = 31).
BASE_CLAUSE = (
    "fixed: model - series_clear_median +1.00 dB PSNR [-5.08, +7.08] at 95%, wins 1 of 2: "
    "the model does not beat it (the interval holds zero)"
)
# s1: 4.1 at both seeds (se_seed 0); seed-averaged 4, 4.2 (se_location 0.1, 1 df, t = 12.706).
S1_CLAUSE = "fixed: model - series_clear_median +4.10 dB PSNR [+2.83, +5.37] at 95%, wins 2 of 2: the model beats it"


def test_compare_gives_each_experiment_the_strongest_over_seeds(runs):
    got = compare_runs(runs, baseline="base")
    by = {r["experiment"]: r for r in got["rows"] if r["protocol"] == "fixed"}
    base, s1 = by["base"]["strongest"], by["s1"]["strongest"]
    assert base["baseline"] == s1["baseline"] == "series_clear_median"
    assert s1["candidates"] == ["least_cloudy_date", "series_clear_median"]  # the mosaic: one seed only
    assert base["difference"] == pytest.approx(1.0) and base["se_seed"] == pytest.approx(1.0)
    assert base["se_location"] == pytest.approx(1.0) and base["df"] == pytest.approx(2.0)
    assert base["ci"] == pytest.approx([1 - 6.0849, 1 + 6.0849], abs=1e-3) and base["wins"] == 1
    assert s1["difference"] == pytest.approx(4.1) and s1["ci"] == pytest.approx([2.8294, 5.3706], abs=1e-3)
    assert s1["wins"] == 2 and s1["samples"] == 2 and s1["seeds"] == 2
    # The keys the viewer and the table read are still there, with what they had.
    assert by["s1"]["difference"]["difference"] == pytest.approx(35.1 - 32.0)
    assert {"split", "experiment", "stage", "protocol", "samples", "per_seed", "mean", "std", "difference"} <= set(
        by["s1"]
    )


def test_compare_markdown_and_json_open_with_the_strongest(runs, tmp_path):
    out, md = tmp_path / "compare.json", tmp_path / "compare.md"
    args = ["compare", "--out", str(out), "--markdown", str(md), "--baseline", "base"]
    for experiment, seed, path in runs:
        args += ["--report", experiment, str(seed), str(path)]
    assert main(args) == 0
    lines = md.read_text().splitlines()
    assert lines[0] == "Against the strongest simple answer (the test split, over seeds):"
    assert lines[2] == f"- base, stage 2 (test, 2 seeds): {BASE_CLAUSE}"
    assert lines[3] == f"- s1, stage 2 (test, 2 seeds): {S1_CLAUSE}"
    assert lines[5].startswith("Mean PSNR (dB) per run")
    header = next(line for line in lines if line.startswith("| protocol |"))
    assert header.endswith("| difference [CI] | strongest simple answer: model - it [CI], wins |")
    row = next(line for line in lines if line.startswith("| fixed | test | s1 |"))
    assert row.endswith("| series_clear_median: +4.10 [+2.83, +5.37], wins 2 of 2 |")
    comparison = json.loads(out.read_text())
    assert {r["experiment"]: r["strongest"]["wins"] for r in comparison["rows"]} == {"base": 1, "s1": 2}


def test_one_seed_and_old_reports_without_series_baselines_still_compare(tmp_path):
    runs = [
        ("base", None, run_report(tmp_path / "b.json", 1, [30.0, 32.0], {"nearest_clear_date": [29.0, 30.0]})),
        ("s1", None, run_report(tmp_path / "s.json", 1, [31.0, 33.0], {"nearest_clear_date": [29.0, 30.0]})),
    ]
    got = compare_runs(runs, baseline="base")
    text = runs_markdown(got)
    assert "- s1, stage 1 (test, one seed): fixed: model - nearest_clear_date +2.50 dB PSNR" in text
    assert "nearest_clear_date: +2.50 [" in text and "(one seed), wins 2 of 2 |" in text


def test_the_viewer_opens_with_the_shown_runs_lines(runs, tmp_path):
    from vcloud.evaluation.compare import write_run_comparison
    from vcloud.export.viewer import comparison_section, evaluation_headlines, render_page

    path = tmp_path / "compare.json"
    write_run_comparison(runs, path, baseline="base")
    section = comparison_section(path, run=("s1", "0"))
    assert section["headlines"]["lines"] == [f"s1, stage 2 (test, 2 seeds): {S1_CLAUSE}"]
    assert section["strongest"] == [f"base, stage 2 (test, 2 seeds): {BASE_CLAUSE}", section["headlines"]["lines"][0]]
    assert section["tables"][0]["rows"][-1]["cells"][-1] == "series_clear_median: +4.10 [+2.83, +5.37], wins 2 of 2"
    # A single run's page: from the shown stages' evaluation reports (stage 0 is not shown).
    reports = [
        write_report(tmp_path / "eval/stage0.json", 0, protocols()),
        write_report(tmp_path / "eval/stage1.json", 1, protocols()),
    ]
    opening = evaluation_headlines(reports)
    assert opening["lines"] == [f"stage 1, fixed: {FIXED_LINE}", f"stage 1, reference: {REFERENCE_LINE}; {FALLBACKS}"]
    page = render_page({"title": "t", "samples": [], "headlines": opening})
    script = (ROOT / "src/vcloud/export/assets/viewer.js").read_text()
    assert "data.headlines || (data.comparison && data.comparison.headlines)" in script and script in page
    payload = json.loads(page.split('id="viewer-data">', 1)[1].split("</script>", 1)[0])
    assert payload["headlines"]["lines"][0] == f"stage 1, fixed: {FIXED_LINE}"


def scored_report(path: Path, stage: int, *, shift: float) -> Path:
    """A report as vcloud evaluate writes one (scoring.score on 6 tiny samples of 3 locations with
    the series composites and the context record), the model the truth plus noise (`shift`)."""
    import torch
    from torch.utils.data import Dataset

    from vcloud.evaluation.scoring import score
    from vcloud.evaluation.series_baselines import NAMES as SERIES_NAMES

    class Samples(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, index):
            g = torch.Generator().manual_seed(index)
            truth = torch.rand(13, 8, 8, generator=g) * 0.3
            x = torch.rand(3, 17, 8, 8, generator=g) * 0.3
            x[:, -1] = torch.rand(3, 8, 8, generator=g) * 0.5  # cloud probability
            k = len(SERIES_NAMES)  # every composite, noisier down the list
            series = truth + torch.randn(k, 13, 8, 8, generator=g) * 0.02 * torch.arange(1, k + 1).view(k, 1, 1, 1)
            return {
                "x": x,
                "target_index": torch.tensor(1),
                "days": torch.tensor([-10.0, 0.0, 10.0]),
                "target": truth,
                "target_prob": x[1, -1],
                "cloud_class": torch.tensor(1 + index % 3),
                "location": torch.tensor(index // 2),
                "dates": torch.tensor([index, index + 1, index + 2]),
                "fallback": torch.tensor(0 if index == 5 else -1),
                "series": series.clamp(0, 1),
            }

    def predict(batch):
        noise = torch.randn(batch["target"].shape, generator=torch.Generator().manual_seed(7)) * shift
        return batch["target"] + noise

    result = {"protocol": {"protocol": "fixed", "dates": 3}, **score(Samples(), predict)}
    return write_report(path, stage, {"fixed": result})


def test_the_documented_report_tables_command_runs_as_written(tmp_path, monkeypatch):
    """docs/evaluation.md's command, its glob expanded as a shell does, on reports vcloud evaluate's
    scorer wrote, in a results folder that also has what `stage*.json` wrongly took (stages.json of
    compare-stages, a research run's val report)."""
    from vcloud.evaluation import scoring

    docs = (ROOT / "docs/evaluation.md").read_text()
    commands = re.findall(r"^vcloud report-tables .*$", docs, re.MULTILINE)
    assert len(commands) == 1, commands
    words = shlex.split(commands[0])
    eval_dir = tmp_path / "results/eval"
    scored_report(eval_dir / "stage1.json", 1, shift=0.05)
    scored_report(eval_dir / "stage2.json", 2, shift=0.001)
    scored_report(eval_dir / "stage2.val.json", 2, shift=0.05)
    monkeypatch.chdir(tmp_path)
    assert main(["compare-stages", "--out", "results/eval/stages.json", "results/eval/stage1.json"]) == 0
    argv = [
        match for word in words[1:] for match in (sorted(glob.glob(word)) if "*" in word or "[" in word else [word])
    ]
    assert [a for a in argv if a.startswith("results/eval/")] == [
        "results/eval/stage1.json",
        "results/eval/stage2.json",
    ]
    assert main(argv) == 0
    outputs = [Path(argv[argv.index(flag) + 1]) for flag in ("--out", "--markdown")]
    assert all(p.is_file() for p in outputs)
    text = outputs[1].read_text()
    for stage in (1, 2):
        result = json.loads((eval_dir / f"stage{stage}.json").read_text())["protocols"]["fixed"]
        assert result["strongest"] and result["context"]["fallbacks"] == {"beyond_window": 1}
        line = f"- stage {stage}, fixed: {scoring.headline(result)}; context policy fallbacks: beyond_window 1 (of 6"
        assert line in text, text
    assert text.startswith("## Against the strongest simple answer")
    assert "the model beats it" in text  # stage 2: the truth within 0.001, far above every composite
