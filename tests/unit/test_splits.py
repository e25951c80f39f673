import pytest
import yaml

from vcloud.data.layout import RoiId
from vcloud.data.splits import assign_splits


def test_official_lists_from_default_config():
    from pathlib import Path

    config = yaml.safe_load((Path(__file__).parents[2] / "config/config.yaml").read_text())
    splits = config["data"]["splits"]
    assert len(splits["test"]) == 13 and len(splits["val"]) == 5
    assert "ROIs1868/119" in splits["test"] and "ROIs2017/22" in splits["val"]


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
