"""s2cloudless as torch tensors (data/cloud_trees.py) predicts what LightGBM predicts."""

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from vcloud.data import cloud_trees, cloudsim
from vcloud.data.cloud_trees import detected_levels, float32_at_or_below, predict, s2cloudless_forest
from vcloud.data.samples import CloudySamples, detected_probability, finish_batch
from vcloud.data.shards import ShardReader
from vcloud.data.store import CLOUD_PROB_SCALE, normalise_s2

KINDS = ("thin", "thick", "opaque")


@pytest.fixture(scope="module")
def booster():
    from vcloud.data.clouds import _detector

    return _detector().classifier.classifier


def _assert_levels_agree(expected: np.ndarray, got: np.ndarray) -> None:
    """Identical uint8 levels for >= 99.9 % of pixels, none off by more than one level."""
    off = np.abs(expected.astype(np.int16) - got.astype(np.int16))
    assert off.max() <= 1, off.max()
    assert (off == 0).mean() >= 0.999, (off == 0).mean()


def test_float32_at_or_below_is_the_largest_float32_not_above():
    assert float32_at_or_below(0.5) == np.float32(0.5)  # representable: itself
    # Compared as doubles: numpy 2 compares np.float32 with a Python float in float32.
    assert float(np.float32(0.1)) > 0.1  # rounding to nearest goes up here ...
    below = float32_at_or_below(0.1)
    assert float(below) < 0.1 and np.nextafter(below, np.float32(1)) == np.float32(0.1)  # ... this does not
    assert float32_at_or_below(0.7) == np.float32(0.7) and float(np.float32(0.7)) < 0.7  # rounding went down
    assert float32_at_or_below(1e300) == np.finfo(np.float32).max
    assert float32_at_or_below(-1e300) == -np.inf


def test_random_reflectances_match_lightgbm(booster, one_thread):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10001, (20000, 10)).astype(np.float32) / np.float32(10000)
    x[:8] = np.repeat([[0.0], [1.0]], 4, axis=0)  # the clip limits
    expected = booster.predict(x)
    got = predict(s2cloudless_forest("cpu"), torch.from_numpy(x)).numpy()
    assert np.abs(got - expected).max() < 1e-5
    levels = lambda p: np.round(p.astype(np.float32) * CLOUD_PROB_SCALE).astype(np.uint8)  # noqa: E731
    _assert_levels_agree(levels(expected), levels(got))
    assert 0.05 < (expected > 0.4).mean() < 0.95  # both cloudy and clear decisions were taken


def test_synthetic_clouded_pixels_match_the_workers_detection(tiny_store, booster, one_thread):
    """The store's images with each kind of synthetic cloud, as CloudySamples makes them."""
    reader = ShardReader(tiny_store)
    rng = np.random.default_rng(1)
    clouded = []
    for location in range(reader.shape[0]):
        images = reader.read_raw(location, list(range(reader.shape[1])))
        for s2 in images.s2[reader.valid_s2[location]]:
            truth = normalise_s2(s2)
            for kind in KINDS:
                clouded.append(cloudsim.apply(truth, *cloudsim.simulate(rng, truth.shape[1:], kind)))
    clouded = np.stack(clouded)  # (I, 13, H, W)
    assert len(clouded) * clouded[0, 0].size >= 10000
    expected = np.stack([detected_probability(image) for image in clouded])  # LightGBM, the worker's path
    pixels = torch.from_numpy(np.ascontiguousarray(np.moveaxis(clouded, 1, -1).reshape(-1, 13)))
    got = detected_levels(pixels).numpy().reshape(expected.shape)
    _assert_levels_agree(expected, got)
    assert (expected > 100).mean() > 0.1 and (expected < 50).mean() > 0.1  # clouds seen and not seen
    bands = np.round(pixels.numpy().clip(0, 1) * 10000).astype(np.uint16).astype(np.float32) / np.float32(10000)
    bands = bands[:, [0, 1, 3, 4, 7, 8, 9, 10, 11, 12]]
    probability = predict(s2cloudless_forest("cpu"), torch.from_numpy(bands)).numpy()
    assert np.abs(probability - booster.predict(bands)).max() < 1e-5


def test_inputs_exactly_at_a_threshold_go_where_lightgbm_sends_them(booster, monkeypatch, one_thread):
    forest = s2cloudless_forest("cpu")
    split = ~forest.is_leaf
    rng = np.random.default_rng(2)
    pixels = []
    for feature in range(10):
        at = np.unique(forest.threshold[split & (forest.feature == feature)].numpy())
        above = np.nextafter(at, np.float32(np.inf))  # the next float32: above the double threshold
        values = np.concatenate([at, above])
        values = values[(values >= 0) & (values <= 1)]
        base = rng.integers(0, 10001, (len(values), 10)).astype(np.float32) / np.float32(10000)
        base[:, feature] = values
        pixels.append(base)
    x = np.concatenate(pixels)
    assert len(x) > 1000
    expected = booster.predict(x, raw_score=True)
    np.testing.assert_allclose(predict_raw(forest, x), expected, rtol=0, atol=1e-9)
    # Thresholds rounded to the nearest float32 (half of them land above LightGBM's double)
    # send some of these inputs the other way: the test sees a wrong rounding.
    monkeypatch.setattr(cloud_trees, "float32_at_or_below", np.float32)
    nearest = cloud_trees.forest_from_booster(booster)
    assert np.abs(predict_raw(nearest, x) - expected).max() > 1e-6


def predict_raw(forest, x: np.ndarray) -> np.ndarray:
    return cloud_trees.raw_score(forest, torch.from_numpy(x)).numpy()


def _batches(tiny_store, **kw):
    kw = dict(dates=3, length=6, seed=4, clear_max_cover=1.01, kinds=KINDS, raw=True, **kw)
    worker = CloudySamples(tiny_store, detect="worker", **kw)
    device = CloudySamples(tiny_store, detect="device", **kw)
    indices = range(6, 12)
    return default_collate([worker[i] for i in indices]), default_collate([device[i] for i in indices])


@pytest.mark.parametrize("crop", [None, 16])
def test_finish_batch_detecting_on_the_device_equals_the_worker(tiny_store, crop, one_thread):
    worker, device = _batches(tiny_store, crop=crop)
    assert "detect_target" in device and "detect_target" not in worker
    rows, slot = torch.arange(len(worker["target_index"])), worker["target_index"]
    # The device batch still carries the stored probability, where the worker had detected.
    assert not torch.equal(worker["prob_raw"][rows, slot], device["prob_raw"][rows, slot])
    expected, got = finish_batch(worker), finish_batch(device)
    assert set(expected) == set(got)
    for key in expected:
        if key not in ("x", "target_prob"):
            assert torch.equal(expected[key].nan_to_num(-7), got[key].nan_to_num(-7)), key
    assert torch.equal(expected["x"][:, :, :-1], got["x"][:, :, :-1])  # S2 and S1
    others = torch.ones(expected["x"].shape[:2], dtype=torch.bool)
    others[rows, slot] = False
    assert torch.equal(expected["x"][others][:, -1], got["x"][others][:, -1])  # other dates' stored probability
    assert torch.equal(got["x"][rows, slot, -1], got["target_prob"])
    level = lambda p: torch.round(p * CLOUD_PROB_SCALE).to(torch.uint8).numpy()  # noqa: E731
    _assert_levels_agree(level(expected["target_prob"]), level(got["target_prob"]))


def test_device_detection_keeps_lightgbm_out_of_the_worker(tiny_store, monkeypatch):
    from vcloud.data import samples

    def forbidden(*args, **kwargs):
        raise AssertionError("the worker ran LightGBM")

    monkeypatch.setattr(samples, "cloud_probability", forbidden)
    kw = dict(dates=3, length=4, seed=1, crop=16, clear_max_cover=1.01, kinds=KINDS, raw=True)
    device = CloudySamples(tiny_store, detect="device", **kw)
    items = [device[i] for i in range(4)]
    assert all(bool(item["detect_target"]) for item in items)
    with pytest.raises(AssertionError, match="ran LightGBM"):
        CloudySamples(tiny_store, detect="worker", **kw)[0]  # the worker path would have


def test_detect_switch_is_checked(tiny_store):
    with pytest.raises(ValueError, match="needs raw=True"):
        CloudySamples(tiny_store, dates=2, clear_max_cover=1.01, detect="device")
    with pytest.raises(ValueError, match="expected one of worker, device"):
        CloudySamples(tiny_store, dates=2, clear_max_cover=1.01, raw=True, detect="gpu")
