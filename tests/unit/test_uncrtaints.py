"""Protocol `uncrtaints`: the reference's fixed sampler, regions and released pairing files.

The store below has hand-set coverages; every expected sample is written out by hand.
"""

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from vcloud.constants import SAMPLE_CHANNELS
from vcloud.data.store import open_store, write_locations
from vcloud.errors import BadInputError
from vcloud.evaluation.series_baselines import NAMES as SERIES_NAMES
from vcloud.evaluation.uncrtaints import (
    PairEntry,
    UncrtaintsSamples,
    convert_pairs,
    fixed_sampler,
    read_pairs,
    reference_argsort,
    region_rois,
)

DATES = [f"2018-{m:02d}-10" for m in (1, 2, 3, 4, 5, 6)]  # date index t -> acquisition date
# location id -> (coverage per date, unusable date or None)
LOCATIONS = {
    "ROIs1868_119_p0": ([0.6, 0.0, 0.3, 0.0, 0.9, 0.2], None),  # asiaEast test ROI
    "ROIs1868_119_p1": ([0.5, 0.7, 0.8, 0.4, 0.05, 0.6], None),  # asiaEast
    "ROIs2017_63_p5": ([0.2, 0.1, 0.0, 0.5, 0.3, None], ("s2", 5)),  # europa; S2 of date 5 missing
    "ROIs1970_22_p0": ([1.0, 0.9, 0.0, 0.8, 0.7, 0.95], None),  # not a dataset ROI (synthetic)
    "ROIs1868_73_p2": ([0.3, 0.2, 0.1, 0.4, 0.0, 0.5], ("s2", 1)),  # asiaEast; S2 of date 1 missing
}


def _locations(tiny_store: Path):
    """One-location Datasets: the tiny store's pixels on 6 dates, hand-set coverage and validity."""
    ds = open_store(tiny_store)
    for i, (name, (cover, bad)) in enumerate(LOCATIONS.items()):
        one = ds.isel(location=slice(i % 2, i % 2 + 1), time=[0, 1, 2, 3, 0, 1]).load()
        one = one.assign_coords(time=np.arange(6, dtype=np.int16))
        rois, roi, patch = name.split("_")
        one = one.assign_coords(
            location=np.array([name], dtype=object),
            rois=("location", np.array([rois], dtype=object)),
            roi=("location", np.array([int(roi)], np.int32)),
            patch=("location", np.array([int(patch[1:])], np.int32)),
        )
        dates = np.array([np.datetime64(d, "ns") for d in DATES])
        one["date_s2"].values[0] = dates
        one["date_s1"].values[0] = dates
        one["cloud_cover"].values[0] = np.array([np.nan if c is None else c for c in cover], np.float32)
        one["valid_s2"].values[0] = True
        one["valid_s1"].values[0] = True
        if bad is not None:
            kind, t = bad
            one[f"valid_{kind}"].values[0, t] = False
            one[f"date_{kind}"].values[0, t] = np.datetime64("NaT")
        for var in one.variables:
            one[var].encoding = {}
        one.attrs = ds.attrs
        yield one


@pytest.fixture(scope="module")
def hand_store(tiny_store, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uncrtaints") / "test.zarr"
    write_locations(_locations(tiny_store), out)
    return out


def _samples(ds):
    """(location id, target, inputs, slot) per sample."""
    return [(ds.reader.locations[i.location], i.target, list(i.inputs), i.slot) for i in ds.items]


def test_fixed_sampler_default_takes_the_first_dates_and_may_include_the_target():
    choice = fixed_sampler([0.6, 0.0, 0.3, 0.0, 0.9], dates=3)
    assert choice.target == 1  # the earliest of the two clear dates
    assert choice.inputs == (0, 1, 2) and choice.match  # the target is an input
    assert fixed_sampler([0.6, 0.0, 0.3, 0.0, 0.9], dates=2).inputs == (0, 1)


def test_reference_argsort_is_numpy_1_24_quicksort_ties_included():
    # Orders recorded from numpy 1.24.4 (the reference pins numpy 1.18.5 / 1.21.6: the same introsort).
    assert reference_argsort([0.0] * 30) == [0, *range(27, 0, -1), 28, 29]
    cover = [0.5, 0.0, 0.2, 0.0, 0.0, 0.1] * 5
    assert reference_argsort(np.float32(cover)) == [
        10, 22, 16, 15, 28, 13, 19, 9, 21, 7, 4, 3, 27, 1, 25, 11, 23, 5, 17, 29, 26, 14, 8, 2, 20, 18, 12, 24, 6, 0,
    ]  # fmt: skip
    cover18 = [0.25, 0.0, 0.5, 0.0, 1.0, 0.0, 0.75, 0.0, 0.25, 0.5, 0.0, 1.0, 0.0, 0.5, 0.25, 0.0, 0.75, 0.0]
    assert reference_argsort(cover18) == [17, 1, 15, 3, 5, 12, 7, 10, 14, 0, 8, 13, 2, 9, 16, 6, 11, 4]
    assert reference_argsort([0.3, 0.0, 0.2, 0.0]) == [1, 3, 2, 0]  # up to 16 dates: insertion sort, stable
    assert reference_argsort([]) == [] and reference_argsort([0.5]) == [0]


def test_fixed_sampler_target_follows_the_reference_among_equal_minima():
    choice = fixed_sampler([0.5, 0.0, 0.2, 0.0, 0.0, 0.1] * 5, dates=3)
    assert choice.target == 10  # numpy 1.24's argsort puts date 10 first; np.argmin would say 1
    assert choice.inputs == (0, 1, 2)


def test_fixed_sampler_falls_back_to_the_first_dates_other_than_the_target():
    choice = fixed_sampler([0.6, 0.0, 0.3, 0.0, 0.9, 0.2], dates=3, min_cov=0.1, max_cov=0.5)
    assert choice.inputs == (0, 2, 3) and choice.target == 1 and not choice.match  # only 0.3, 0.2 qualify
    enough = fixed_sampler([0.6, 0.0, 0.3, 0.0, 0.1, 0.2], dates=3, min_cov=0.1, max_cov=0.5)
    assert enough.inputs == (2, 4, 5) and enough.match  # bounds are inclusive
    assert not fixed_sampler([0.5, 0.7, 0.05], dates=2).match  # target above 1e-3: flagged


def test_default_protocol_on_the_hand_made_store(hand_store):
    ds = UncrtaintsSamples(hand_store, dates=3)
    assert _samples(ds) == [
        ("ROIs1868_119_p0", 1, [0, 1, 2], 1),  # target among the inputs: it is the slot
        ("ROIs1868_119_p1", 4, [0, 1, 2], 2),  # slot: the input nearest to date 4
        ("ROIs2017_63_p5", 2, [0, 1, 2], 2),
        ("ROIs1970_22_p0", 2, [0, 1, 2], 2),
    ]
    assert ds.skipped == [("ROIs1868_73_p2", "date index 1 selected but unusable (image missing or bad)")]
    assert [i.match for i in ds.items] == [True, False, True, True]
    info = ds.describe()
    assert info["protocol"] == "uncrtaints" and info["dates"] == 3 and info["region"] == "all"
    assert info["samples"] == 4 and info["target_in_inputs"] == 3 and info["coverage_match"] == 3


def test_coverage_window_and_t_are_configurable(hand_store):
    ds = UncrtaintsSamples(hand_store, dates=3, min_cov=0.1, max_cov=0.5)
    assert _samples(ds) == [
        ("ROIs1868_119_p0", 1, [0, 2, 3], 0),  # fallback; dates 0 and 2 equally near: the earlier
        ("ROIs1868_119_p1", 4, [0, 1, 2], 2),  # fallback (only 0.5 and 0.4 qualify)
        ("ROIs2017_63_p5", 2, [0, 1, 3], 1),  # date 5 (S2 missing) counts as coverage 1: excluded
        ("ROIs1970_22_p0", 2, [0, 1, 3], 1),  # fallback
        ("ROIs1868_73_p2", 4, [0, 2, 3], 2),  # date 1 (S2 missing) counts as coverage 1: excluded
    ]
    assert ds.skipped == []
    two = UncrtaintsSamples(hand_store, dates=2)
    assert _samples(two)[1] == ("ROIs1868_119_p1", 4, [0, 1], 1)


def test_regions_select_the_reference_rois(hand_store):
    east = UncrtaintsSamples(hand_store, dates=3, region="asiaEast")
    assert [n for n, *_ in _samples(east)] == ["ROIs1868_119_p0", "ROIs1868_119_p1"]
    assert [n for n, _ in east.skipped] == ["ROIs1868_73_p2"]
    europa = UncrtaintsSamples(hand_store, dates=3, region="europa")
    assert [n for n, *_ in _samples(europa)] == ["ROIs2017_63_p5"]
    with pytest.raises(BadInputError, match="no uncrtaints sample in region 'africa'"):
        UncrtaintsSamples(hand_store, dates=3, region="africa")
    with pytest.raises(BadInputError, match="region 'asia' is not one of all, africa"):
        region_rois("asia")
    assert len(region_rois("europa")) == 17  # 5 test, 1 val, 11 train ROIs


def test_items_carry_the_selected_images(hand_store):
    ds = UncrtaintsSamples(hand_store, dates=3)
    location, target, inputs, slot = ds.items[1].location, ds.items[1].target, ds.items[1].inputs, ds.items[1].slot
    item = ds[1]
    sample = ds.reader.read(location, [*inputs, target])
    assert item["x"].shape == (3, SAMPLE_CHANNELS, 32, 32)
    np.testing.assert_array_equal(item["x"][:, :13].numpy(), sample.s2[:3])
    np.testing.assert_array_equal(item["target"].numpy(), sample.s2[3])
    assert int(item["target_index"]) == slot == 2
    assert item["days"].tolist() == [-59.0, -28.0, 0.0]  # 2018-01-10, 02-10, 03-10 minus 03-10
    assert int(item["cloud_class"]) == int(ds.reader.cloud_class[location, inputs[slot]])
    assert not bool(item["target_in_inputs"]) and not bool(item["coverage_match"])
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert batch["x"].shape[0] == 4 and batch["target_in_inputs"].tolist() == [True, False, True, True]


def test_store_errors_are_one_line(hand_store):
    with pytest.raises(BadInputError, match="too few for T=6"):
        UncrtaintsSamples(hand_store, dates=6, min_cov=0.5, max_cov=0.5)
    with pytest.raises(BadInputError, match=r"need 0 <= min_cov <= max_cov <= 1"):
        UncrtaintsSamples(hand_store, dates=3, min_cov=0.6, max_cov=0.5)


def test_a_date_without_s1_is_used_with_s1_zeroed_and_marked(hand_store, tmp_path):
    """S1 missing at every date of ROIs1868_119_p0: the same samples, S1 channels zero, s1_valid False."""
    import shutil

    import zarr

    store = tmp_path / "no_s1.zarr"
    shutil.copytree(hand_store, store)
    valid_s1 = zarr.open_group(str(store), mode="r+")["valid_s1"]
    table = valid_s1[...]
    table[0, :] = False
    valid_s1[...] = table
    with_s1, without = UncrtaintsSamples(hand_store, dates=3), UncrtaintsSamples(store, dates=3)
    assert _samples(without) == _samples(with_s1) and without.skipped == with_s1.skipped
    item, other = without[0], without[1]
    assert without.reader.locations[without.items[0].location] == "ROIs1868_119_p0"
    assert item["s1_valid"].tolist() == [False] * 3 and not bool(item["target_s1_valid"])
    assert not item["x"][:, 13:15].any() and not item["target_s1"].any()
    assert other["s1_valid"].all() and bool(other["target_s1_valid"]) and other["x"][:, 13:15].any()
    assert torch.equal(item["x"][:, :13], with_s1[0]["x"][:, :13])  # S2 and the rest unchanged


# --- the released pairing file ---------------------------------------------------------------


def _paths(kind: str, name: str, dates=DATES) -> list[str]:
    rois, roi, patch = name.split("_")
    return [
        f"SEN12MSCRTS_val_test/{rois}/{roi}/{kind.upper()}/{t}/{kind}_{rois}_{roi}_ImgNo_{t}_{d}_patch_{patch[1:]}.tif"
        for t, d in enumerate(dates)
    ]


def _entry(name: str, cover, *, value=lambda c: torch.as_tensor([np.float32(c)]), dates=DATES) -> dict:
    """An entry as the reference's pre_compute_data_samples.py writes it (DataLoader-collated)."""
    paths = {"S1": _paths("s1", name, dates), "S2": _paths("s2", name, dates)}
    return {"coverage": [value(c) for c in cover], "paths": paths}


def _save(path: Path, pairs: dict) -> Path:
    np.save(path, pairs, allow_pickle=True)
    return path


PAIRS = {  # coverages differ from the store's: the file's must win
    0: ("ROIs1868_119_p1", [0.0, 0.5, 0.5, 0.5, 0.5, 0.5]),
    1: ("ROIs1158_106_p3", [0.5, 0.0, 0.5, 0.5, 0.5, 0.5]),  # a test ROI the store does not hold
    2: ("ROIs1868_119_p0", [0.5, 0.5, 0.5, 0.5, 0.5, 0.0]),
    3: ("ROIs2017_63_p5", [0.5, 0.5, 0.5, 0.25, 0.0, 0.5]),
}


def test_pairs_file_decides_the_dates_and_is_matched_by_location(hand_store, tmp_path):
    path = _save(tmp_path / "generic_3_test_all_s2cloudless_mask.npy", {k: _entry(n, c) for k, (n, c) in PAIRS.items()})
    ds = UncrtaintsSamples(hand_store, dates=3, pairs=path)
    assert _samples(ds) == [
        ("ROIs1868_119_p0", 5, [0, 1, 2], 2),
        ("ROIs1868_119_p1", 0, [0, 1, 2], 0),
        ("ROIs2017_63_p5", 4, [0, 1, 2], 2),
    ]
    assert ds.describe()["pairs_outside_store"] == 1  # ROIs1158/106 entry: counted, not used
    east = UncrtaintsSamples(hand_store, dates=3, region="asiaEast", pairs=path)
    assert [n for n, *_ in _samples(east)] == ["ROIs1868_119_p0", "ROIs1868_119_p1"]
    window = UncrtaintsSamples(hand_store, dates=3, pairs=path, min_cov=0.2, max_cov=0.3)
    assert _samples(window)[2] == ("ROIs2017_63_p5", 4, [0, 1, 2], 2)  # fallback: one date (0.25) qualifies


def test_pairs_values_may_be_tensors_numpy_scalars_or_floats(tmp_path):
    for value in (lambda c: torch.as_tensor([np.float32(c)]), np.float32, float):
        path = _save(tmp_path / "p.npy", {7: _entry("ROIs1868_119_p1", [0.25, 0.5, 0.0, 1.0, 0.5, 0.5], value=value)})
        (entry,) = read_pairs(path)
        assert entry == PairEntry(7, "ROIs1868_119_p1", (0.25, 0.5, 0.0, 1.0, 0.5, 0.5), tuple(DATES), tuple(DATES))


def test_convert_pairs_writes_checked_json_that_reads_back_the_same(hand_store, tmp_path):
    path = _save(tmp_path / "pairs.npy", {k: _entry(n, c) for k, (n, c) in PAIRS.items()})
    assert convert_pairs(path, tmp_path / "out" / "pairs.json") == 4
    assert read_pairs(tmp_path / "out" / "pairs.json") == read_pairs(path)
    from_json = UncrtaintsSamples(hand_store, dates=3, pairs=tmp_path / "out" / "pairs.json")
    assert _samples(from_json) == _samples(UncrtaintsSamples(hand_store, dates=3, pairs=path))
    (tmp_path / "bad.json").write_text('{"format": "something else"}')
    with pytest.raises(BadInputError, match="bad.json: not a vcloud.uncrtaints-pairs version 1 file"):
        read_pairs(tmp_path / "bad.json")


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pairs_file_cannot_run_code(tmp_path):
    marker = tmp_path / "ran"
    pairs = {0: _entry("ROIs1868_119_p1", [0.0] * 6)}
    pairs[0]["extra"] = _Payload(marker)
    path = _save(tmp_path / "evil.npy", pairs)
    with pytest.raises(BadInputError, match=r"evil.npy: refuses to unpickle pathlib.*Path"):
        read_pairs(path)
    assert not marker.exists()
    assert pickle.loads(pickle.dumps(_Payload(marker))) is None and marker.exists()  # it would have run


@pytest.mark.parametrize(
    "pairs, message",
    [
        ({0: {"coverage": [0.0] * 6}}, r"entry 0: expected a dict with 'coverage' and 'paths'"),
        ({"a": _entry("ROIs1868_119_p1", [0.0] * 6)}, r"entry 'a': keys must be sample indices"),
        ({0: _entry("ROIs1868_119_p1", [0.0] * 5 + [1.5])}, r"entry 0 date 5: coverage 1.5 is outside 0..1"),
        ({0: _entry("ROIs1868_119_p1", [0.0] * 5)}, r"entry 0: paths.S2 must list 5 files"),
        (
            {0: _entry("ROIs1868_119_p1", [0.0] * 6), 1: _entry("ROIs1868_119_p1", [0.0] * 6)},
            r"entries 0 and 1 both name ROIs1868_119_p1",
        ),
    ],
)
def test_malformed_pairs_files_fail_with_one_line(tmp_path, pairs, message):
    with pytest.raises(BadInputError, match=message):
        read_pairs(_save(tmp_path / "p.npy", pairs))


def test_pairs_are_verified_against_the_store(hand_store, tmp_path):
    moved = [*DATES[:3], "2018-04-11", *DATES[4:]]
    path = _save(tmp_path / "dates.npy", {0: _entry("ROIs1868_119_p1", [0.0] * 6, dates=moved)})
    with pytest.raises(
        BadInputError,
        match=(
            r"entry 0 \(ROIs1868_119_p1\): s2 date index 3 is 2018-04-11 in the file, "
            r"2018-04-10 in the store"
        ),
    ):
        UncrtaintsSamples(hand_store, dates=3, pairs=path)
    path = _save(tmp_path / "patch.npy", {4: _entry("ROIs1868_119_p9", [0.0] * 6)})
    with pytest.raises(BadInputError, match=r"entry 4 \(ROIs1868_119_p9\): location not in store"):
        UncrtaintsSamples(hand_store, dates=3, pairs=path)
    path = _save(tmp_path / "short.npy", {0: _entry("ROIs1868_119_p1", [0.0] * 4, dates=DATES[:4])})
    with pytest.raises(BadInputError, match=r"entry 0 \(ROIs1868_119_p1\): 4 dates, store .* has 6"):
        UncrtaintsSamples(hand_store, dates=3, pairs=path)
    path = _save(tmp_path / "other.npy", {0: _entry("ROIs1158_106_p1", [0.0] * 6)})
    with pytest.raises(BadInputError, match=r"other.npy: no entry of region 'all' names a location of"):
        UncrtaintsSamples(hand_store, dates=3, pairs=path)
    np.save(tmp_path / "array.npy", np.zeros(3))
    with pytest.raises(BadInputError, match=r"array.npy: holds a float64 array of shape \(3,\), not a pickled dict"):
        read_pairs(tmp_path / "array.npy")


# --- through vcloud evaluate ------------------------------------------------------------------


def _config(tmp_path: Path, evaluation: dict | None, name: str = "models.yaml") -> Path:
    import yaml

    from tests.workflow.snakemake_run import ROOT

    models = yaml.safe_load((ROOT / "tests/workflow/tiny_models.yaml").read_text())
    models["stage1"]["model"]["wind_scan"] = False
    if evaluation is not None:
        models["evaluation"] = evaluation
    (tmp_path / name).write_text(yaml.safe_dump(models))
    return tmp_path / name


def _stage0(tmp_path: Path, config: Path) -> Path:
    from vcloud.config import load_model_config
    from vcloud.models.autoencoder import Autoencoder
    from vcloud.train.checkpoint import checkpoint_meta, save_checkpoint

    torch.manual_seed(0)
    path = tmp_path / "stage0.pt"
    model = Autoencoder(load_model_config(config).stage0.model)
    save_checkpoint(path, {**checkpoint_meta(stage=0, config_hash="t"), "model": model.state_dict()})
    return path


def test_vcloud_evaluate_reports_the_protocol_its_samples_baselines_and_paired_errors(hand_store, tmp_path, caplog):
    import json

    from vcloud.cli import main
    from vcloud.evaluation.stats import paired_difference

    config = _config(tmp_path, None)  # no evaluation section: T=3, all regions, [0, 1], computed
    out = tmp_path / "eval.json"
    argv = [
        "evaluate",
        "--stage",
        "0",
        "--stage0",
        str(_stage0(tmp_path, config)),
        "--store",
        str(hand_store),
        "--config",
        str(config),
        "--samples",
        "2",
        "--out",
        str(out),
    ]
    with caplog.at_level("INFO", logger="vcloud.evaluation.evaluate"):
        assert main(argv) == 0
    report = json.loads(out.read_text())
    assert list(report["protocols"]) == ["fixed", "reference", "uncrtaints"]
    result = report["protocols"]["uncrtaints"]
    setup = result["protocol"]
    assert {k: setup[k] for k in ("protocol", "dates", "region", "min_cov", "max_cov", "pairs")} == {
        "protocol": "uncrtaints",
        "dates": 3,
        "region": "all",
        "min_cov": 0.0,
        "max_cov": 1.0,
        "pairs": "computed",
    }
    assert setup["items"] == [  # written by hand from LOCATIONS (as test_default_protocol_on_the_hand_made_store)
        ["ROIs1868_119_p0", 1, [0, 1, 2], 1],
        ["ROIs1868_119_p1", 4, [0, 1, 2], 2],
        ["ROIs2017_63_p5", 2, [0, 1, 2], 2],
        ["ROIs1970_22_p0", 2, [0, 1, 2], 2],
    ]
    assert setup["samples"] == result["samples"] == 4 and setup["target_in_inputs"] == 3
    assert setup["skipped"] == ["ROIs1868_73_p2: date index 1 selected but unusable (image missing or bad)"]
    assert report["protocols"]["fixed"]["protocol"]["dates"] == 2  # the model config's data.input_dates
    inputs = {"least_cloudy_date", "median_mosaic", "nearest_clear_date"}
    for name, protocol in report["protocols"].items():  # the three input baselines on every protocol's samples
        assert inputs <= set(protocol)
        # ours add the series baselines (evaluation/series_baselines.py); the published one keeps its three
        series = set(SERIES_NAMES) if name != "uncrtaints" else set()
        assert set(protocol["paired"]) == inputs | series
        assert protocol["strongest"]["baseline"] in inputs | series
    # the paired difference is stats.py's on the stored per-sample values, and the textbook one
    model, nearest = result["model"]["per_sample"]["psnr"], result["nearest_clear_date"]["per_sample"]["psnr"]
    paired = result["paired"]["nearest_clear_date"]["overall"]["psnr"]
    assert paired == paired_difference(model, nearest, groups=result["location"])
    d = np.asarray(model) - np.asarray(nearest)
    assert paired["difference"] == pytest.approx(d.mean()) and paired["se"] == pytest.approx(d.std(ddof=1) / 2)
    assert paired["se_location"] == pytest.approx(paired["se"])  # one sample per location
    by_class = result["paired"]["nearest_clear_date"]["by_class"]
    assert sum(v["psnr"]["samples"] for v in by_class.values()) == 4
    fixed = report["protocols"]["fixed"]
    ssim = np.subtract(fixed["model"]["per_sample"]["ssim"], fixed["median_mosaic"]["per_sample"]["ssim"])
    assert fixed["paired"]["median_mosaic"]["overall"]["ssim"]["se"] == pytest.approx(ssim.std(ddof=1) / np.sqrt(2))
    log = caplog.text
    assert "uncrtaints: T=3, region all, coverage [0, 1], pairs computed, target among the inputs in 3 of 4" in log
    assert "| uncrtaints | model - nearest_clear_date | all | 4 | 4 | " in log


def test_evaluate_takes_the_pairing_file_and_the_configured_t_and_region(hand_store, tmp_path):
    from vcloud.evaluation.evaluate import evaluate

    pairs = _save(tmp_path / "pairs.npy", {k: _entry(n, c) for k, (n, c) in PAIRS.items()})
    config = _config(tmp_path, {"uncrtaints": {"dates": 2, "region": "asiaEast", "pairs": str(tmp_path / "no.npy")}})
    report = evaluate(
        stage=0,
        store=hand_store,
        out=tmp_path / "e.json",
        checkpoints={0: _stage0(tmp_path, config)},
        config_path=config,
        samples=1,
        uncrtaints_pairs=pairs,
    )
    setup = report["protocols"]["uncrtaints"]["protocol"]
    assert setup["pairs"] == str(pairs) and setup["dates"] == 2 and setup["region"] == "asiaEast"
    assert setup["items"] == [["ROIs1868_119_p0", 5, [0, 1], 1], ["ROIs1868_119_p1", 0, [0, 1], 0]]
    assert setup["target_in_inputs"] == 1 and setup["pairs_outside_store"] == 0  # ROIs1158/106: not asiaEast
    # the configured file, when no option overrides it: a missing one stops the evaluation
    with pytest.raises(BadInputError, match=r"no.npy: pairing file not found"):
        evaluate(
            stage=0,
            store=hand_store,
            out=tmp_path / "f.json",
            checkpoints={0: _stage0(tmp_path, config)},
            config_path=config,
            samples=1,
        )
    assert not (tmp_path / "f.json").exists()


def test_a_store_without_uncrtaints_samples_is_still_evaluated(hand_store, tmp_path):
    from vcloud.evaluation.evaluate import evaluate
    from vcloud.evaluation.scoring import table

    config = _config(tmp_path, {"uncrtaints": {"dates": 7}})
    report = evaluate(
        stage=0,
        store=hand_store,
        out=tmp_path / "e.json",
        checkpoints={0: _stage0(tmp_path, config)},
        config_path=config,
        samples=1,
    )
    result = report["protocols"]["uncrtaints"]
    assert result["samples"] == 0 and "6 dates per location, too few for T=7 inputs" in result["unavailable"]
    assert result["protocol"]["pairs"] == "computed" and report["protocols"]["fixed"]["samples"] == 1
    assert "uncrtaints: T=7, region all, coverage [0, 1], pairs computed" in table(report)
    assert "not run: " in table(report)


@pytest.mark.parametrize(
    "evaluation, message",
    [
        (
            {"uncrtaints": {"regoin": "all"}},
            "unknown key evaluation.uncrtaints.regoin (allowed: dates, region, min_cov, max_cov, pairs)",
        ),
        (
            {"uncrtaints": {"region": "asia"}},
            "key evaluation.uncrtaints.region: 'asia' is not one of all, africa, america, asiaEast, asiaWest, europa",
        ),
        ({"uncrtaints": {"dates": 0}}, "key evaluation.uncrtaints.dates: 0 must be >= 1"),
        (
            {"uncrtaints": {"min_cov": 0.5, "max_cov": 0.2}},
            "key evaluation.uncrtaints: need 0 <= min_cov (0.5) <= max_cov (0.2) <= 1",
        ),
        ({"nearest_clear_max_cover": 2}, "key evaluation.nearest_clear_max_cover: 2.0 is outside 0..1"),
    ],
)
def test_a_bad_protocol_setting_fails_with_one_line(hand_store, tmp_path, capsys, evaluation, message):
    from vcloud.cli import main

    config = _config(tmp_path, evaluation)
    argv = [
        "evaluate",
        "--stage",
        "0",
        "--stage0",
        str(tmp_path / "x.pt"),
        "--store",
        str(hand_store),
        "--config",
        str(config),
        "--out",
        str(tmp_path / "e.json"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err == f"vcloud evaluate: error: {config}: {message}"
    assert not (tmp_path / "e.json").exists()


def test_config_regions_are_the_reference_regions():
    import typing

    from vcloud.config.model_sets import UncrtaintsRegion
    from vcloud.evaluation.uncrtaints import REGION_CHOICES

    assert typing.get_args(UncrtaintsRegion) == REGION_CHOICES


def test_vcloud_uncrtaints_convert(tmp_path, capsys):
    from vcloud.cli import main

    path = _save(tmp_path / "generic_3_test_all_s2cloudless_mask.npy", {k: _entry(n, c) for k, (n, c) in PAIRS.items()})
    assert main(["uncrtaints-convert", str(path), str(tmp_path / "pairs.json")]) == 0
    assert capsys.readouterr().out.strip() == f"{tmp_path / 'pairs.json'}: 4 entries of {path}"
    assert read_pairs(tmp_path / "pairs.json") == read_pairs(path)
    assert main(["uncrtaints-convert", str(tmp_path / "missing.npy"), str(tmp_path / "x.json")]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"vcloud uncrtaints-convert: error: {tmp_path / 'missing.npy'}: pairing file not found"
    )
