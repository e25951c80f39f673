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
