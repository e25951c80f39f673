import numpy as np
import pytest
import yaml

from vcloud.data.layout import RoiId
from vcloud.data.splits import assign_splits


def test_default_config_splits_the_dataset_as_the_official_regions_do():
    """The lists in config/config.yaml, applied to the dataset's 53 ROIs, give exactly the
    official per-region split (data/layout.py REGION_SPLITS): 13 test, 5 val, 35 train."""
    from pathlib import Path

    from vcloud.data.layout import dataset_region, dataset_rois

    config = yaml.safe_load((Path(__file__).parents[2] / "config/config.yaml").read_text())
    splits = assign_splits(dataset_rois(), **config["data"]["splits"])
    official = {name: [roi for roi in dataset_rois() if dataset_region(roi)[1] == name] for name in splits}
    assert splits == official
    assert {name: len(rois) for name, rois in splits.items()} == {"train": 35, "val": 5, "test": 13}
    assert RoiId("ROIs1868", 119) in splits["test"] and RoiId("ROIs1970", 119) in splits["train"]


def test_roi_number_repeated_in_another_folder_is_train():
    rois = [RoiId("ROIs1868", 119), RoiId("ROIs1158", 119), RoiId("ROIs2017", 22), RoiId("ROIs1970", 22)]
    splits = assign_splits(rois, test=["ROIs1868/119"], val=["ROIs2017/22"])
    assert splits == {
        "train": [RoiId("ROIs1158", 119), RoiId("ROIs1970", 22)],
        "val": [RoiId("ROIs2017", 22)],
        "test": [RoiId("ROIs1868", 119)],
    }


def test_listed_rois_that_are_absent_are_ignored_and_overlap_is_an_error():
    splits = assign_splits([RoiId("ROIs1158", 1)], test=["ROIs1868/119"], val=[])
    assert splits["test"] == [] and splits["train"] == [RoiId("ROIs1158", 1)]
    with pytest.raises(ValueError, match="ROIs1868/119 listed in both"):
        assign_splits([], test=["ROIs1868/119"], val=["ROIs1868/119"])


# --- a temporal split (data.temporal_split): val and test as date ranges of every location -----

SPEC = {"val": ["2018-06-01", "2018-07-31"], "test": ["2018-10-01", "2018-12-31"], "gap_days": 20}


def test_a_temporal_split_keeps_val_and_test_ranges_and_trains_beyond_the_gap():
    import datetime as dt

    from vcloud.data.splits import temporal_ranges
    from vcloud.data.store import DateRanges

    ranges = temporal_ranges(SPEC)
    assert ranges == {
        # training: every date but those within 20 days of val or test (the gap, either side)
        "train": DateRanges(drop=(("2018-05-12", "2018-08-20"), ("2018-09-11", "2019-01-20"))),
        "val": DateRanges(keep=(("2018-06-01", "2018-07-31"),)),
        "test": DateRanges(keep=(("2018-10-01", "2018-12-31"),)),
    }
    assert ranges["train"].flags() == "--drop 2018-05-12 2018-08-20 --drop 2018-09-11 2019-01-20"
    assert ranges["val"].flags() == "--keep 2018-06-01 2018-07-31"
    # YAML dates (an unquoted 2018-06-01) as strings; test before val; a training range of its own
    spec = {
        "test": [dt.date(2018, 1, 1), dt.date(2018, 1, 31)],
        "val": [dt.date(2018, 3, 3), dt.date(2018, 3, 31)],
        "train": ["2018-05-01", "2018-12-31"],
        "gap_days": 30,
    }
    ranges = temporal_ranges(spec)
    assert ranges["train"] == DateRanges(
        keep=(("2018-05-01", "2018-12-31"),), drop=(("2018-02-01", "2018-04-30"), ("2017-12-02", "2018-03-02"))
    )
    assert ranges["test"].keep == (("2018-01-01", "2018-01-31"),)
    # val and test 31 days apart: more than the gap of 30
    dates = np.array(
        ["2018-01-31", "2018-02-01", "2018-03-02", "2018-03-03", "2018-04-30", "2018-05-01"], "datetime64[D]"
    )
    assert ranges["train"].mask(dates).tolist() == [False, False, False, False, False, True]
    assert ranges["val"].mask(dates).tolist() == [False, False, False, True, False, False]
    assert temporal_ranges({**SPEC, "gap_days": 0})["train"].drop == (
        ("2018-06-01", "2018-07-31"),
        ("2018-10-01", "2018-12-31"),
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"holdout": ["2018-01-01", "2018-01-31"]},
            "data.temporal_split.holdout: not a key of a temporal split (val, test, gap_days, train)",
        ),
        (
            {"val": None},
            "data.temporal_split.val: missing (a temporal split needs val and test date ranges and gap_days, the days kept free around them)",
        ),
        (
            {"test": None},
            "data.temporal_split.test: missing (a temporal split needs val and test date ranges and gap_days, the days kept free around them)",
        ),
        (
            {"gap_days": None},
            "data.temporal_split.gap_days: missing (a temporal split needs val and test date ranges and gap_days, the days kept free around them)",
        ),
        ({"val": ["2018-06-01"]}, 'data.temporal_split.val: ["2018-06-01"] is not [FIRST, LAST], two dates YYYY-MM-DD'),
        (
            {"val": ["2018-06-01", "2018-06-30", "2018-07-31"]},
            'data.temporal_split.val: ["2018-06-01", "2018-06-30", "2018-07-31"] is not [FIRST, LAST], two dates YYYY-MM-DD',
        ),
        ({"val": "2018-06-01"}, 'data.temporal_split.val: "2018-06-01" is not [FIRST, LAST], two dates YYYY-MM-DD'),
        (
            {"test": ["2018-13-01", "2018-12-31"]},
            'data.temporal_split.test: ["2018-13-01", "2018-12-31"] is not [FIRST, LAST], two dates YYYY-MM-DD',
        ),
        (
            {"test": ["2018-12-31", "2018-10-01"]},
            "data.temporal_split.test: 2018-12-31 is after 2018-10-01 (give [FIRST, LAST])",
        ),
        (
            {"train": [20180101, "2018-03-01"]},
            'data.temporal_split.train: [20180101, "2018-03-01"] is not [FIRST, LAST], two dates YYYY-MM-DD',
        ),
        ({"gap_days": -1}, "data.temporal_split.gap_days: -1 is not a whole number of days >= 0"),
        ({"gap_days": 2.5}, "data.temporal_split.gap_days: 2.5 is not a whole number of days >= 0"),
        ({"gap_days": True}, "data.temporal_split.gap_days: true is not a whole number of days >= 0"),
        (
            {"test": ["2018-07-01", "2018-08-31"]},
            "data.temporal_split.test: 2018-07-01..2018-08-31 overlaps val 2018-06-01..2018-07-31; keep them more than gap_days (20) days apart",
        ),
        (
            {"test": ["2018-08-20", "2018-09-30"]},  # 20 days after val's last date: not more than the gap
            "data.temporal_split.test: 2018-08-20..2018-09-30 starts 20 days after val 2018-06-01..2018-07-31; keep them more than gap_days (20) days apart",
        ),
        (
            {"val": ["2019-01-01", "2019-01-31"]},  # val after test, 1 day on
            "data.temporal_split.val: 2019-01-01..2019-01-31 starts 1 day after test 2018-10-01..2018-12-31; keep them more than gap_days (20) days apart",
        ),
        (
            {"train": ["2018-01-01", "2018-05-12"]},  # its last date is the gap's first before val
            "data.temporal_split.train: 2018-01-01..2018-05-12 reaches within gap_days (20) of val 2018-06-01..2018-07-31 (2018-05-12..2018-08-20 is kept free)",
        ),
        (
            {"train": ["2018-08-21", "2018-12-01"]},  # after val's gap, into test
            "data.temporal_split.train: 2018-08-21..2018-12-01 reaches within gap_days (20) of test 2018-10-01..2018-12-31 (2018-09-11..2019-01-20 is kept free)",
        ),
    ],
)
def test_a_bad_temporal_split_is_one_line_naming_the_key(change, message):
    from vcloud.data.splits import temporal_ranges
    from vcloud.errors import ConfigError

    spec = {**SPEC, **change}
    spec = {key: value for key, value in spec.items() if value is not None}
    with pytest.raises(ConfigError) as err:
        temporal_ranges(spec)
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_a_temporal_split_that_is_not_a_mapping_is_one_line():
    from vcloud.data.splits import temporal_ranges
    from vcloud.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        temporal_ranges(["2018-06-01", "2018-07-31"])
    assert str(err.value) == (
        'data.temporal_split: ["2018-06-01", "2018-07-31"] is not {val: [FIRST, LAST], test: [FIRST, LAST], gap_days: N}'
    )


def test_the_training_range_may_end_just_beyond_the_gap():
    from vcloud.data.splits import temporal_ranges

    ranges = temporal_ranges({**SPEC, "train": ["2018-01-01", "2018-05-11"]})
    assert ranges["train"].keep == (("2018-01-01", "2018-05-11"),)
    assert temporal_ranges({**SPEC, "test": ["2018-08-21", "2018-09-30"]})["test"].keep == (
        ("2018-08-21", "2018-09-30"),
    )


def test_assemble_flags_of_each_split_follow_the_temporal_split():
    """What rules assemble_split and split_location pass to vcloud assemble (data.smk)."""
    from types import SimpleNamespace

    from vcloud.data.splits import split_date_flags, split_location_store, temporal_ranges

    assert split_date_flags(None, "train") == ""  # SEN12MS-CR-TS or the synthetic data: every date
    assert split_date_flags(SimpleNamespace(temporal=None), "val") == ""  # your own locations, split by location
    folder = SimpleNamespace(temporal=temporal_ranges(SPEC))
    assert split_date_flags(folder, "train") == " --drop 2018-05-12 2018-08-20 --drop 2018-09-11 2019-01-20"
    assert split_date_flags(folder, "val") == " --keep 2018-06-01 2018-07-31"
    assert split_date_flags(folder, "test") == " --keep 2018-10-01 2018-12-31"
    assert split_location_store("results/prepared", "test", "oslo") == "results/prepared/test/oslo.zarr"
