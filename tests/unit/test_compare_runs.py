"""Experiments compared over seeds (stats.seeded_difference, compare.compare_runs, vcloud compare)
on constructed per-sample scores whose answers are worked out by hand."""

from __future__ import annotations

import json
import math

import pytest
from scipy.stats import t as student_t

from vcloud.cli import main
from vcloud.errors import BadInputError
from vcloud.evaluation.compare import compare_runs
from vcloud.evaluation.stats import seeded_difference


def test_a_difference_that_moves_only_with_the_seed_has_only_a_seed_level():
    # Seed 0: +1 on both samples, seed 1: +3. Mean 2; per-seed differences 1 and 3 (sd sqrt 2),
    # se_seed = sqrt(2) / sqrt(2) = 1; the seed-averaged differences are 2 and 2: se_location 0.
    got = seeded_difference([[11, 21], [13, 23]], [[10, 20], [10, 20]], groups=["a", "b"])
    assert got["difference"] == pytest.approx(2.0) and got["per_seed"] == pytest.approx([1.0, 3.0])
    assert got["se_seed"] == pytest.approx(1.0) and got["se_location"] == pytest.approx(0.0)
    assert got["se"] == pytest.approx(1.0) and got["df"] == pytest.approx(1.0)
    half = student_t.ppf(0.975, 1)  # 12.706
    assert got["ci"] == pytest.approx([2 - half, 2 + half])


def test_a_difference_that_moves_only_with_the_sample_has_only_a_location_level():
    # Both seeds: +1 on location a, +3 on b. se_seed 0; seed-averaged differences 1 and 3, two
    # locations: se_location = sqrt(2 / 1 * (1 + 1)) / 2 = 1, one degree of freedom.
    got = seeded_difference([[11, 23], [11, 23]], [[10, 20], [10, 20]], groups=["a", "b"])
    assert got["difference"] == pytest.approx(2.0) and got["se_seed"] == pytest.approx(0.0)
    assert got["se_location"] == pytest.approx(1.0) and got["se"] == pytest.approx(1.0)
    assert got["df"] == pytest.approx(1.0)


def test_both_levels_add_and_the_degrees_of_freedom_are_welch_satterthwaites():
    # Three seeds (per-seed mean differences 1, 2, 3: se_seed = 1 / sqrt 3), four samples on two
    # locations whose seed-averaged differences are 1, 1 (a) and 3, 3 (b): e = -1, -1, 1, 1,
    # S_a = -2, S_b = 2, se_location = sqrt(2 * 8) / 4 = 1.
    offsets = [-1.0, 0.0, 1.0]
    a = [[1 + o, 1 + o, 3 + o, 3 + o] for o in offsets]
    b = [[0.0] * 4] * 3
    got = seeded_difference(a, b, groups=["a", "a", "b", "b"])
    assert got["se_seed"] == pytest.approx(1 / math.sqrt(3)) and got["se_location"] == pytest.approx(1.0)
    assert got["se"] == pytest.approx(math.sqrt(1 / 3 + 1))
    assert got["df"] == pytest.approx((1 / 3 + 1) ** 2 / ((1 / 3) ** 2 / 2 + 1 / 1))
    assert got["ci"][1] - got["difference"] == pytest.approx(student_t.ppf(0.975, got["df"]) * got["se"])


def test_one_seed_has_no_seed_level():
    got = seeded_difference([[11, 23]], [[10, 20]], groups=["a", "b"])
    assert got["seeds"] == 1 and got["se_seed"] is None
    assert got["se"] == pytest.approx(got["se_location"]) and got["df"] == pytest.approx(1.0)


def test_identical_runs_differ_by_nothing_with_certainty():
    got = seeded_difference([[1, 2], [3, 4]], [[1, 2], [3, 4]], groups=["a", "b"])
    assert got["difference"] == 0 and got["se"] == 0 and got["ci"] == [0, 0]


def report(tmp_path, name, stage, psnr, *, locations=(0, 1), settings=None):
    protocol = {
        "protocol": {"protocol": "fixed", "dates": 4, **(settings or {})},
        "samples": len(psnr),
        "cloud_class": ["thin"] * len(psnr),
        "location": list(locations),
        "model": {"per_sample": {"psnr": list(psnr)}},
    }
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"stage": stage, "protocols": {"fixed": protocol}}))
    return path


def test_each_experiment_has_its_seeds_mean_and_std_and_the_others_a_paired_difference(tmp_path):
    runs = [
        ("base", 0, report(tmp_path, "b0", 2, [30.0, 32.0])),
        ("base", 1, report(tmp_path, "b1", 2, [32.0, 34.0])),
        ("s1", 0, report(tmp_path, "s0", 2, [31.0, 33.0])),
        ("s1", 1, report(tmp_path, "s1", 2, [35.0, 37.0])),
    ]
    got = compare_runs(runs, baseline="base")
    base, s1 = (r for r in got["rows"] if r["protocol"] == "fixed")
    assert base["per_seed"] == {"0": 31.0, "1": 33.0} and base["mean"] == 32.0
    assert base["std"] == pytest.approx(math.sqrt(2)) and base["difference"] is None
    assert s1["mean"] == 34.0 and s1["difference"]["per_seed"] == pytest.approx([1.0, 3.0])
    assert s1["difference"]["difference"] == pytest.approx(2.0) and s1["difference"]["se_seed"] == pytest.approx(1.0)
    assert got["seeds"] == [0, 1] and got["experiments"] == ["base", "s1"]
    assert s1["shared_with_baseline"] is False


def test_a_stage_read_from_the_baselines_run_is_marked_shared_not_scored_as_a_result(tmp_path):
    from vcloud.evaluation.compare import runs_markdown

    b0, b1 = report(tmp_path, "b0", 2, [30.0, 32.0]), report(tmp_path, "b1", 2, [32.0, 34.0])
    got = compare_runs([("base", 0, b0), ("base", 1, b1), ("s3", 0, b0), ("s3", 1, b1)], baseline="base")
    shared = next(r for r in got["rows"] if r["experiment"] == "s3")
    assert shared["shared_with_baseline"] and shared["difference"]["difference"] == 0
    assert "| fixed | test | s3 | 2 | 31.00 | 33.00 | 32.00 ± 1.41 | same stage as base |" in runs_markdown(got)


def test_runs_scored_on_different_samples_are_refused(tmp_path):
    runs = [
        ("base", 0, report(tmp_path, "b0", 2, [30.0, 32.0])),
        ("t3", 0, report(tmp_path, "t0", 2, [30.0, 32.0], settings={"dates": 3})),
    ]
    with pytest.raises(BadInputError, match="protocol fixed, stage 2: .* were scored on different samples"):
        compare_runs(runs, baseline="base")
    other_locations = [runs[0], ("x", 0, report(tmp_path, "x0", 2, [30.0, 32.0], locations=(0, 2)))]
    with pytest.raises(BadInputError, match="different samples"):
        compare_runs(other_locations, baseline="base")


def test_vcloud_compare_writes_both_files_or_neither(tmp_path, capsys):
    out, md = tmp_path / "compare.json", tmp_path / "compare.md"
    b0, s0 = report(tmp_path, "b0", 1, [30.0, 32.0]), report(tmp_path, "s0", 1, [31.0, 33.0])
    args = ["compare", "--out", str(out), "--markdown", str(md), "--baseline", "base"]
    assert main([*args, "--report", "base", "0", str(b0), "--report", "s1", "0", str(s0)]) == 0
    text = md.read_text()
    assert "| fixed | test | s1 | 2 | 32.00 | 32.00 | +1.00 [+1.00, +1.00] (one seed) |" in text, text
    assert json.loads(out.read_text())["baseline"] == "base"
    out.unlink(), md.unlink()
    bad = report(tmp_path, "bad", 1, [30.0, 32.0], settings={"dates": 3})
    assert main([*args, "--report", "base", "0", str(b0), "--report", "s1", "0", str(bad)]) == 2
    assert "were scored on different samples" in capsys.readouterr().err
    assert not out.exists() and not md.exists()
    assert main([*args, "--report", "other", "0", str(b0)]) == 2
    assert "--baseline: 'base' has no test report" in capsys.readouterr().err


def test_with_val_reports_the_table_is_decided_on_val_and_reports_test(tmp_path):
    from vcloud.evaluation.compare import runs_markdown

    test = [("base", 0, report(tmp_path, "tb", 1, [30.0, 32.0])), ("s1", 0, report(tmp_path, "ts", 1, [31.0, 33.0]))]
    val = [("base", 0, report(tmp_path, "vb", 1, [20.0, 22.0])), ("s1", 0, report(tmp_path, "vs", 1, [20.5, 22.5]))]
    got = compare_runs(test, baseline="base", val_reports=val)
    assert got["decided_on"] == "val"
    by = {(r["split"], r["experiment"]): r for r in got["rows"]}
    assert by["val", "s1"]["difference"]["difference"] == pytest.approx(0.5)
    assert by["test", "s1"]["difference"]["difference"] == pytest.approx(1.0)
    text = runs_markdown(got)
    assert "Designs are chosen on the **val** split" in text
    # Within a protocol the val rows come first: the choice, then what it is reported at.
    assert text.index("| fixed | val | s1 |") < text.index("| fixed | test | base |")
    assert compare_runs(test, baseline="base")["decided_on"] == "test"
