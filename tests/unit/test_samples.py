import numpy as np
import pytest
import torch

from vcloud.constants import CLOUD_CHANNEL, CLOUD_CLASSES, S1_CHANNELS, S1_VALID_CHANNEL, S2_CHANNELS, SAMPLE_CHANNELS
from vcloud.data import cloudsim
from vcloud.data.samples import ClearImages, CloudySamples, EpochSampler, UnlabelledSamples


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


def test_samples_are_a_function_of_the_index(tiny_store):
    ds = CloudySamples(tiny_store, dates=3, length=5, seed=1, crop=16, clear_max_cover=1.01, kinds=("thick",))
    a, b = ds[7], ds[7]
    for key in a:
        assert torch.equal(a[key], b[key]) or torch.isnan(a[key]).all() and torch.isnan(b[key]).all(), key
    assert not torch.equal(ds[7]["x"], ds[8]["x"])
    item = ds[0]
    assert item["x"].shape == (3, SAMPLE_CHANNELS, 16, 16) and item["target"].shape == (13, 16, 16)
    t = int(item["target_index"])
    assert item["days"][t] == 0 and torch.all(item["days"][1:] >= item["days"][:-1])
    assert not torch.equal(item["x"][t, S2_CHANNELS], item["target"])  # the cloud is on the input only
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


def test_epoch_concat_batches_collate_when_one_part_lacks_a_key(tiny_store):
    """Stage 3 mixes CloudySamples with pseudo-labelled items that pick their keys from a list:
    a key only one part gives (s1_valid) is left out, so the mixed batch collates."""
    from torch.utils.data import default_collate

    from vcloud.data.samples import EpochConcat

    cloudy = CloudySamples(tiny_store, dates=2, length=2, seed=1, clear_max_cover=1.01)

    class Picked(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            item = cloudy[index]
            return {k: v for k, v in item.items() if k not in ("s1_valid", "target_s1_valid")}

    both = EpochConcat([cloudy, Picked()])
    batch = default_collate([both[i] for i in range(4)])
    assert "s1_valid" not in batch and batch["x"].shape[0] == 4
    alone = EpochConcat([cloudy])
    assert default_collate([alone[0], alone[1]])["s1_valid"].shape == (2, 2)


def _old_cloudy_item(ds: CloudySamples, index: int) -> dict:
    """CloudySamples.__getitem__ as it was before the raw path (legacy zarr reader, numpy), with
    the per-date S1 validity every sample now carries."""
    from vcloud.data.reader import StoreReader as LegacyReader
    from vcloud.data.samples import context_record, detected_probability, stack_sample
    from vcloud.data.store import CLOUD_PROB_SCALE

    reader = LegacyReader(ds.reader.path)
    rng, epoch = ds._rng(index)
    location, target_t, dates, target_index, kind = ds._pick(rng, epoch, index)
    ys, xs = ds._window(rng)
    sample = reader.read(location, dates)
    s2 = sample.s2[:, :, ys, xs]
    truth = s2[target_index].copy()
    opacity, shadow = cloudsim.simulate(rng, truth.shape[1:], kind)
    s2 = s2.copy()
    s2[target_index] = cloudsim.apply(truth, opacity, shadow)
    prob = np.nan_to_num(sample.cloud_prob[:, ys, xs], nan=1.0)
    prob[target_index] = detected_probability(s2[target_index]) / np.float32(CLOUD_PROB_SCALE)
    item = stack_sample(
        s2, sample.s1[:, :, ys, xs], prob, reader.date_s2[location, dates], target_index, s1_valid=sample.valid_s1
    )
    item["wind"] = torch.from_numpy(reader.wind[location, target_t])
    item["target"] = torch.from_numpy(np.ascontiguousarray(truth))
    item["cloud_class"] = torch.tensor(CLOUD_CLASSES.index(kind))
    item["location"] = torch.tensor(location)
    item.update(context_record(target_t, dates, ds.fallback(location, target_t)))  # what it recorded since
    return item


def _assert_same(old: dict, new: dict) -> None:
    assert set(old) == set(new), set(old) ^ set(new)
    for key in old:
        assert old[key].dtype == new[key].dtype and old[key].shape == new[key].shape, key
        assert torch.equal(old[key], new[key]) or (
            torch.isnan(old[key]).any() and torch.equal(old[key].nan_to_num(-7), new[key].nan_to_num(-7))
        ), key


@pytest.mark.parametrize("crop", [None, 16])
def test_raw_samples_finished_on_the_device_equal_the_old_cpu_samples(tiny_store, crop):
    from torch.utils.data import default_collate

    from vcloud.data.samples import finish_batch

    kw = dict(dates=3, length=6, seed=4, crop=crop, clear_max_cover=1.01, kinds=("thin", "thick", "opaque"))
    cpu, raw = CloudySamples(tiny_store, **kw), CloudySamples(tiny_store, raw=True, **kw)
    indices = range(6, 12)
    old = [_old_cloudy_item(cpu, i) for i in indices]
    for i, item in zip(indices, old):
        _assert_same(item, cpu[i])  # the CPU path is unchanged
    assert raw[6]["s2_raw"].dtype == torch.int16  # what travels to the device: stored bits
    _assert_same(default_collate(old), finish_batch(default_collate([raw[i] for i in indices])))


def test_raw_clear_images_finished_equal_the_cpu_ones(tiny_store):
    from torch.utils.data import default_collate

    from vcloud.data.samples import finish_batch

    cpu = ClearImages(tiny_store, length=4, crop=8, clear_max_cover=1.01)
    raw = ClearImages(tiny_store, length=4, crop=8, clear_max_cover=1.01, raw=True)
    _assert_same(default_collate([cpu[i] for i in range(4)]), finish_batch(default_collate([raw[i] for i in range(4)])))


def test_reflectance_above_int16_survives_the_trip():
    from vcloud.data.samples import _bits, _reflectance
    from vcloud.data.store import normalise_s2

    s2 = np.array([[[0, 9999, 10000, 32768, 65535]]], np.uint16)
    assert torch.equal(_reflectance(_bits(s2)), torch.from_numpy(normalise_s2(s2)))


def test_target_cloud_probability_is_the_detectors_not_the_synthetic_opacity(tiny_store):
    """No oracle: the target's probability channel is s2cloudless on the clouded image."""
    from vcloud.data.clouds import cloud_probability
    from vcloud.data.store import CLOUD_PROB_SCALE

    ds = CloudySamples(tiny_store, dates=3, length=6, seed=5, clear_max_cover=1.01, kinds=("thin", "thick", "opaque"))
    for i in range(6):
        item = ds[i]
        rng, epoch = ds._rng(i)
        *_, kind = ds._pick(rng, epoch, i)
        ds._window(rng)
        opacity, _ = cloudsim.simulate(rng, item["target"].shape[1:], kind)
        t = int(item["target_index"])
        prob = item["x"][t, -1].numpy()
        assert torch.equal(item["target_prob"], item["x"][t, -1])
        assert not np.allclose(prob, opacity, atol=0.02), kind  # not the synthetic opacity
        clouded = np.round(item["x"][t, :13].numpy() * 10000).astype(np.uint16)
        expected = np.round(cloud_probability(clouded[None], num_threads=1)[0] * CLOUD_PROB_SCALE) / CLOUD_PROB_SCALE
        np.testing.assert_allclose(prob, expected, atol=1e-6)  # the detector, at the store's scale
        if kind == "opaque":
            assert prob.mean() > 0.5  # and the detector sees the cloud


def test_fixed_kinds_show_every_clear_target_once_per_kind(tiny_store):
    kinds = ("thin", "thick", "opaque")
    ds = CloudySamples(tiny_store, dates=2, seed=3, clear_max_cover=1.01, kinds=kinds)
    assert len(ds) == 3 * len(ds.targets)
    pairs = []
    for i in range(len(ds)):
        rng, epoch = ds._rng(i)
        location, target_t, _, _, kind = ds._pick(rng, epoch, i)
        pairs.append((location, target_t, kind))
    expected = {(int(loc), int(t), k) for loc, t in ds.targets for k in kinds}
    assert len(set(pairs)) == len(pairs) and set(pairs) == expected
    shorter = CloudySamples(tiny_store, dates=2, length=4, seed=3, clear_max_cover=1.01, kinds=kinds)
    assert torch.equal(shorter[2]["x"], ds[2]["x"])  # sample i does not depend on the length


def test_detected_probability_of_a_stored_image_is_its_stored_probability(tiny_store):
    """Pixels a synthetic cloud leaves untouched keep the stored probability: it is the same."""
    from vcloud.data.samples import detected_probability
    from vcloud.data.shards import ShardReader
    from vcloud.data.store import normalise_s2

    reader = ShardReader(tiny_store)
    images = reader.read_raw(0, list(range(reader.shape[1])))
    for t in np.flatnonzero(reader.valid_s2[0]):
        stored = images.cloud_prob[t]
        np.testing.assert_array_equal(detected_probability(normalise_s2(images.s2[t])), stored)


@pytest.mark.parametrize("raw", [False, True])
def test_sample_tensor_layout_is_the_named_channel_slices(tiny_store, raw):
    """x[:, S2_CHANNELS] is the store's S2, S1_CHANNELS its S1, S1_VALID_CHANNEL whether the date has
    S1, CLOUD_CHANNEL the probability."""
    from torch.utils.data import default_collate

    from vcloud.data.samples import finish_batch
    from vcloud.data.store import normalise_s1, normalise_s2

    ds = CloudySamples(tiny_store, dates=3, length=4, seed=2, clear_max_cover=1.01, kinds=("thick",), raw=raw)
    batch = finish_batch(default_collate([ds[i] for i in range(4)]))
    x = batch["x"]
    assert x.shape[2] == SAMPLE_CHANNELS == 17
    channels = list(range(SAMPLE_CHANNELS))
    assert (channels[S2_CHANNELS], channels[S1_CHANNELS]) == (list(range(13)), [13, 14])
    assert (channels[S1_VALID_CHANNEL], channels[CLOUD_CHANNEL]) == (15, 16)
    assert x[:, :, S1_VALID_CHANNEL].eq(1).all()  # the tiny store has S1 at every date
    rows = torch.arange(len(x))
    slot = batch["target_index"]
    torch.testing.assert_close(x[rows, slot][:, S1_CHANNELS], batch["target_s1"])
    torch.testing.assert_close(x[rows, slot][:, CLOUD_CHANNEL], batch["target_prob"])
    # A date other than the target carries the store's own images, untouched.
    reader, (location, _, dates, target_index, _) = ds.reader, ds.pick(0)
    other = next(i for i in range(len(dates)) if i != target_index)
    images = reader.read_raw(location, [dates[other]])
    np.testing.assert_allclose(x[0, other, S2_CHANNELS].numpy(), normalise_s2(images.s2)[0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(x[0, other, S1_CHANNELS].numpy(), normalise_s1(images.s1)[0], rtol=0, atol=1e-6)
