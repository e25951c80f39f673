import numpy as np
import pytest

from vcloud.data.samples import CloudySamples
from vcloud.train.evaluate import ReferenceSamples, score, table


def test_reference_protocol_targets_the_least_cloudy_date(tiny_store):
    ds = ReferenceSamples(tiny_store, dates=2)
    reader = ds.reader
    location, truth, dates, slot = ds.items[0]
    cover = np.nan_to_num(reader.cloud_cover[location], nan=1.0)
    assert truth == int(np.argmin(cover)) and truth not in dates
    assert abs(dates[slot] - truth) == min(abs(d - truth) for d in dates)  # reconstruct at the nearest date
    item = ds[0]
    np.testing.assert_array_equal(item["target"].numpy(), reader.read(location, [truth]).s2[0])
    assert item["x"].shape[0] == 2 and int(item["target_index"]) == slot


def test_score_reports_means_classes_and_baselines_on_the_same_samples(tiny_store):
    samples = CloudySamples(tiny_store, dates=2, length=6, seed=1, clear_max_cover=1.01, kinds=("thin", "opaque"))
    result = score(samples, lambda batch: batch["target"])  # a perfect "model"
    assert result["samples"] == 6 and set(result["cloud_class"]) <= {"thin", "opaque"}
    assert result["model"]["mean"]["psnr"] == pytest.approx(100.0)  # the documented cap
    assert result["model"]["mean"]["ssim"] == pytest.approx(1.0)
    assert result["least_cloudy_date"]["mean"]["psnr"] < 100.0
    counts = sum(c["samples"] for c in result["median_mosaic"]["by_class"].values())
    assert counts == 6 and len(result["median_mosaic"]["per_sample"]["rmse"]) == 6
    text = table({"protocols": {"fixed": result}})
    assert "| fixed | model | 100.00 |" in text
