import numpy as np
import pytest
import torch

from vcloud.data import cloudsim
from vcloud.data.samples import ClearImages, CloudySamples, EpochSampler, UnlabelledSamples, _pick_dates


@pytest.mark.parametrize(
    ("epoch", "phase"),
    [(0, "thin_only"), (29, "thin_only"), (30, "mixed"), (89, "mixed"), (90, "all"), (99, "all")],
)
def test_curriculum_boundaries_of_the_field_report(epoch, phase):
    # LUMI stage 1: epochs 0-29 thin_only, 30-89 mixed, 90-99 all (of 100).
    assert cloudsim.curriculum_phase(epoch, 100, mixed_from=0.3, all_from=0.9) == phase


def test_simulated_clouds_have_their_class_properties():
    rng = np.random.default_rng(0)
    thin, _ = cloudsim.simulate(rng, (32, 32), "thin")
    thick, shadow = cloudsim.simulate(rng, (32, 32), "thick")
    opaque, _ = cloudsim.simulate(rng, (32, 32), "opaque")
    assert 0.05 < thin.max() <= 0.45 + 1e-6  # semi-transparent everywhere
    assert 0.15 <= (thick > 0.5).mean() <= 0.75 and shadow.max() > 0  # partial, with a shadow
    assert opaque.min() >= 0.9  # everything covered
    ground = np.full((13, 32, 32), 0.1, np.float32)
    cloudy = cloudsim.apply(ground, opaque, np.zeros_like(opaque))
    assert cloudy[1].mean() > 0.4  # bright in the visible


def test_epoch_sampler_shards_equally_and_resumes_mid_epoch():
    full = EpochSampler(10, shuffle=True, seed=3)
    full.set_epoch(2)
    order = list(full)
    assert sorted(i - 20 for i in order) == list(range(10))  # a permutation, tagged with the epoch
    resumed = EpochSampler(10, shuffle=True, seed=3)
    resumed.set_epoch(2, start=4)
    assert list(resumed) == order[4:]
    shards = [EpochSampler(10, rank=r, world_size=3, seed=3) for r in range(3)]
    for s in shards:
        s.set_epoch(0)
    assert [len(s) for s in shards] == [4, 4, 4]  # equal steps on every rank
    assert set().union(*map(set, shards)) == set(range(10))


def test_pick_dates_keeps_the_target_in_time_order():
    rng = np.random.default_rng(0)
    usable = np.array([True, False, True, True, True, True])
    dates, target_index = _pick_dates(rng, usable, 3, 4)
    assert dates == sorted(dates) and dates[target_index] == 3 and 1 not in dates


def test_samples_are_a_function_of_the_index(tiny_store):
    ds = CloudySamples(tiny_store, dates=3, length=5, seed=1, crop=16, clear_max_cover=1.01, kinds=("thick",))
    a, b = ds[7], ds[7]
    for key in a:
        assert torch.equal(a[key], b[key]) or torch.isnan(a[key]).all() and torch.isnan(b[key]).all(), key
    assert not torch.equal(ds[7]["x"], ds[8]["x"])
    item = ds[0]
    assert item["x"].shape == (3, 16, 16, 16) and item["target"].shape == (13, 16, 16)
    t = int(item["target_index"])
    assert item["days"][t] == 0 and torch.all(item["days"][1:] >= item["days"][:-1])
    assert not torch.equal(item["x"][t, :13], item["target"])  # the cloud is on the input only
    assert int(item["cloud_class"]) == 2  # thick


def test_curriculum_changes_the_cloud_kinds_by_epoch(tiny_store):
    ds = CloudySamples(tiny_store, dates=2, length=8, clear_max_cover=1.01, epochs=10, mixed_from=0.3, all_from=0.9)
    first = {int(ds[i]["cloud_class"]) for i in range(8)}
    last = {int(ds[9 * 8 + i]["cloud_class"]) for i in range(8)}
    assert first == {1}  # thin only
    assert last <= {1, 2, 3} and 3 in last


def test_clear_images_and_unlabelled(tiny_store):
    with pytest.raises(ValueError, match="no clear image"):
        ClearImages(tiny_store, clear_max_cover=0.0)
    clear = ClearImages(tiny_store, crop=8, clear_max_cover=1.01)
    assert clear[0]["target"].shape == (13, 8, 8)
    unlabelled = UnlabelledSamples(tiny_store, dates=2, clear_max_cover=0.0)  # nothing counts as clear
    item = unlabelled[0]
    assert item["visible"].dtype == torch.bool and "target" not in item


def test_epoch_concat_passes_the_epoch_to_each_part(tiny_store):
    from vcloud.data.samples import EpochConcat

    a = ClearImages(tiny_store, length=3, seed=1, crop=8, clear_max_cover=1.01)
    b = ClearImages(tiny_store, length=2, seed=2, crop=8, clear_max_cover=1.01)
    both = EpochConcat([a, b])
    assert len(both) == 5
    assert torch.equal(both[2 * 5 + 1]["target"], a[2 * 3 + 1]["target"])  # epoch 2, part a
    assert torch.equal(both[2 * 5 + 4]["target"], b[2 * 2 + 1]["target"])  # epoch 2, part b
