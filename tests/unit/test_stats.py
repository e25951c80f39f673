"""Paired statistics, checked against values computed by hand."""

import math

import pytest

from vcloud.evaluation.stats import compare, paired_difference, paired_report


def test_paired_standard_error_by_hand():
    out = paired_difference([30, 32, 29, 35], [28, 31, 30, 31])  # d = 2, 1, -1, 4
    assert out["samples"] == 4 and out["mean_a"] == 31.5 and out["mean_b"] == 30.0
    assert out["difference"] == pytest.approx(1.5)
    assert out["se"] == pytest.approx(math.sqrt(13 / 3) / 2)  # sum of squared deviations 13, ddof 1


def test_pairing_removes_the_shared_difficulty():
    out = paired_difference([20, 30, 40], [19, 29.5, 39])  # d = 1, 0.5, 1
    assert out["difference"] == pytest.approx(5 / 6)
    assert out["se"] == pytest.approx(1 / 6)  # unpaired it would be about 8.2


def test_location_clustered_standard_error_by_hand():
    out = paired_difference([30, 32, 29, 35], [28, 31, 30, 31], groups=["x", "x", "y", "z"])
    # residuals 0.5, -0.5, -2.5, 2.5; location sums 0, -2.5, 2.5; G = 3
    assert out["locations"] == 3
    assert out["se_location"] == pytest.approx(math.sqrt(3 / 2 * 12.5) / 4)
    one_each = paired_difference([30, 32, 29, 35], [28, 31, 30, 31], groups=[1, 2, 3, 4])
    assert one_each["se_location"] == pytest.approx(one_each["se"])  # one sample per location: the same


def test_too_few_samples_give_no_standard_error():
    out = paired_difference([30.0], [29.0], groups=[0])
    assert out["difference"] == 1.0 and out["se"] is None and out["se_location"] is None
    with pytest.raises(ValueError, match="equal 1-d shapes"):
        paired_difference([1, 2], [1])


def test_bootstrap_resamples_whole_locations():
    a = [1.0] * 5 + [3.0] * 5
    out = paired_difference(a, [0.0] * 10, groups=[0] * 5 + [1] * 5, resamples=4000, seed=1)
    # two locations: resampled means 1, 2, 3 with probabilities 1/4, 1/2, 1/4
    assert out["ci"] == [1.0, 3.0] and out["ci_level"] == 0.95
    again = paired_difference(a, [0.0] * 10, groups=[0] * 5 + [1] * 5, resamples=4000, seed=1)
    assert again["ci"] == out["ci"]
    flat = paired_difference([2.0] * 4, [1.0] * 4, resamples=100)
    assert flat["ci"] == [1.0, 1.0]


RESULT = {  # the scorer's output for one protocol (evaluate.score)
    "samples": 4,
    "cloud_class": ["thin", "thin", "opaque", "opaque"],
    "location": [0, 0, 1, 2],
    "model": {"per_sample": {"psnr": [30, 32, 29, 35], "rmse": [0.03, 0.02, 0.04, 0.01]}},
    "least_cloudy_date": {"per_sample": {"psnr": [28, 31, 30, 31], "rmse": [0.04, 0.03, 0.03, 0.03]}},
    "median_mosaic": {"per_sample": {"psnr": [30, 32, 29, 35], "rmse": [0.03, 0.02, 0.04, 0.01]}},
}


def test_compare_per_metric_and_per_class():
    out = compare(RESULT, "model", "least_cloudy_date")
    psnr = out["overall"]["psnr"]
    assert psnr["difference"] == pytest.approx(1.5) and psnr["se"] == pytest.approx(math.sqrt(13 / 12))
    assert psnr["se_location"] == pytest.approx(math.sqrt(18.75) / 4)
    assert out["overall"]["rmse"]["difference"] == pytest.approx(-0.0075)  # lower RMSE: the model is better
    thin, opaque = out["by_class"]["thin"]["psnr"], out["by_class"]["opaque"]["psnr"]
    assert thin["samples"] == 2 and thin["difference"] == pytest.approx(1.5) and thin["se"] == pytest.approx(0.5)
    assert opaque["difference"] == pytest.approx(1.5) and opaque["se"] == pytest.approx(2.5)
    assert list(out["by_class"]) == ["thin", "opaque"]


def test_paired_report_covers_every_other_method():
    report = paired_report(RESULT)
    assert list(report) == ["least_cloudy_date", "median_mosaic"]
    same = report["median_mosaic"]["overall"]["psnr"]
    assert same["difference"] == 0.0 and same["se"] == 0.0
