"""Your own locations as the workflow's data source (data/locations.py): the config checked in one
line naming the key, each location in exactly its split under a ROI id of its own; and the
protocols on a store of your own imagery (the uncrtaints protocol is SEN12MS-CR-TS's)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from vcloud.data.layout import RoiId
from vcloud.data.locations import folder_locations
from vcloud.errors import BadInputError, ConfigError

ROOT = Path(__file__).parents[2]
SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"


def _location(root: Path, name: str, dates: int, *, tiles: tuple[str, ...] = ()) -> None:
    """A location's folder as the parse-time checks see it: dated S2 file names (never opened)."""
    for tile in tiles or ("",):
        for day in range(dates):
            path = root / name / tile / "S2" / f"T32TQM_{dt.date(2019, 3, 1) + dt.timedelta(days=5 * day):%Y%m%d}.tif"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")


@pytest.fixture
def folder(tmp_path) -> Path:
    root = tmp_path / "mine"
    _location(root, "oslo", 6, tiles=("east", "west"))
    _location(root, "bergen", 3)
    _location(root, "tromso", 118)
    _location(root, "bodo", 4)
    return root


def _config(root: Path, **data) -> dict:
    locations = {"train": ["oslo", "bergen"], "val": ["tromso"], "test": ["bodo"]}
    return {
        "synthetic": {"enabled": False},
        "data": {"source": "folder", "folder": str(root), "locations": locations, **data},
    }


def test_each_location_is_one_roi_in_exactly_its_split(folder):
    found = folder_locations(_config(folder))
    # ROI ids by name order, whatever the splits: ROIs9000/1 = bergen, ...
    assert [(loc.name, loc.splits, loc.roi, loc.dates) for loc in found.locations] == [
        ("bergen", ("train",), RoiId("ROIs9000", 1), 3),
        ("bodo", ("test",), RoiId("ROIs9000", 2), 4),
        ("oslo", ("train",), RoiId("ROIs9000", 3), 6),
        ("tromso", ("val",), RoiId("ROIs9000", 4), 118),
    ]
    assert {split: [loc.slug for loc in found.split(split)] for split in ("train", "val", "test")} == {
        "train": ["bergen", "oslo"],
        "val": ["tromso"],
        "test": ["bodo"],
    }
    assert found.get("oslo").path == folder / "oslo"  # its tiles are its scenes, all in train
    assert found.times == 118  # every store keeps the longest series, so that the splits assemble
    assert found.temporal is None  # split by location: every date of a location in its split


def _refused(config: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        folder_locations(config)
    assert str(err.value) == message


def test_a_location_named_twice_is_one_line(folder):
    config = _config(folder)
    config["data"]["locations"]["test"] = ["bodo", "oslo"]
    _refused(
        config,
        "data.locations.test: 'oslo' listed also in data.locations.train; a location belongs to one split (or give "
        "data.temporal_split: its dates then split by date ranges)",
    )
    config["data"]["locations"]["test"] = ["bodo", "bodo"]
    _refused(config, "data.locations.test: 'bodo' listed twice")


def test_a_location_missing_on_disk_or_without_s2_is_one_line(folder):
    config = _config(folder)
    config["data"]["locations"]["val"] = ["narvik"]
    _refused(config, f"data.locations.val: 'narvik': no folder {folder / 'narvik'}")
    (folder / "narvik" / "S1").mkdir(parents=True)
    _refused(
        config,
        f"data.locations.val: 'narvik': {folder / 'narvik'} has no S2/ (or <tile>/S2/) folder of dated GeoTIFFs "
        "(docs/data.md, 'Your own locations')",
    )


def test_a_series_too_short_or_misnamed_is_one_line_naming_the_location(folder):
    config = _config(folder)
    _location(folder, "alta", 1)
    config["data"]["locations"]["val"] = ["alta"]
    _refused(
        config,
        f"data.locations.val: 'alta': 1 date with S2 in {folder / 'alta'}; a location needs at least 2 (a clear "
        "target and another date, whatever data.input_dates): add dates or leave it out",
    )
    (folder / "alta" / "S2" / "T32TQM_march.tif").write_bytes(b"")
    _refused(
        config,
        f"data.locations.val: 'alta': {folder / 'alta' / 'S2' / 'T32TQM_march.tif'}: no date at the end of the file "
        "name (expected <anything>_YYYYMMDD.tif or <anything>_YYYY-MM-DD.tif)",
    )


def test_what_a_folder_source_needs_is_one_line(folder):
    config = _config(folder)
    config["synthetic"]["enabled"] = True
    _refused(
        config,
        "data.source: folder, but synthetic.enabled is true: set synthetic.enabled: false (else the synthetic data "
        "would be prepared)",
    )
    config = _config(folder)
    del config["data"]["folder"]
    _refused(config, "data.folder: required with data.source: folder (the folder whose sub-folders are locations)")
    config = _config(folder, folder=str(folder / "nowhere"))
    _refused(config, f"data.folder: {folder / 'nowhere'}: not a folder")
    config = _config(folder)
    config["data"]["locations"]["val"] = []
    _refused(config, "data.locations.val: no location; every split (train, val, test) needs one")


def test_locations_without_the_folder_source_are_one_line(folder):
    from vcloud.data.locations import folder_source

    config = _config(folder)
    del config["data"]["source"]
    with pytest.raises(ConfigError) as err:
        folder_source(config)
    assert str(err.value) == (
        "data.folder: read only with data.source: folder (now sen12mscrts); add data.source: folder or remove "
        "data.folder"
    )
    assert folder_source({"data": {"source": "sen12mscrts"}}) is None
    assert [loc.name for loc in folder_source(_config(folder)).locations] == ["bergen", "bodo", "oslo", "tromso"]


def _schema_errors(**data):
    """The schema's one line for the default config with a folder source and `data` changed."""
    import copy

    import yaml

    from vcloud.config.workflow import schema_errors

    config = copy.deepcopy(yaml.safe_load((ROOT / "config/config.yaml").read_text()))
    config["data"].update({"source": "folder", "folder": "mine", **data})
    return schema_errors(config, yaml.safe_load(SCHEMA.read_text()))


def test_the_schema_names_a_bad_location_key():
    errors = _schema_errors

    assert errors(locations={"train": ["a"], "val": ["b"], "test": ["c"]}) is None
    assert errors(locations={"train": ["a"], "test": ["c"]}) == "missing key data.locations.val"
    assert errors(locations={"train": ["a"], "val": ["b"], "test": ["c"], "holdout": ["d"]}) == (
        "unknown key data.locations.holdout (allowed: test, train, val)"
    )
    assert errors(locations={"train": ["a b"], "val": ["b"], "test": ["c"]}) == (
        "key data.locations.train.0: 'a b' does not match '^[A-Za-z0-9][A-Za-z0-9_.-]*$'"
    )
    assert errors(source="archive") == "key data.source: 'archive' is not one of ['sen12mscrts', 'folder']"
    import yaml

    from vcloud.config.workflow import schema_errors

    default = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    assert schema_errors(default, yaml.safe_load(SCHEMA.read_text())) is None  # no source, no folder, unchanged


# --- a temporal split: one location is enough (data.temporal_split) ---------------------------

# 40 dates every 5 days from 2019-03-01 (_location): 2019-03-01 .. 2019-09-12
TEMPORAL = {"val": ["2019-05-01", "2019-05-31"], "test": ["2019-08-01", "2019-08-31"], "gap_days": 10}


def test_with_a_temporal_split_one_location_is_in_every_split(tmp_path):
    from vcloud.data.splits import temporal_ranges

    _location(tmp_path / "mine", "alta", 40)
    found = folder_locations(_config(tmp_path / "mine", locations=["alta"], temporal_split=TEMPORAL))
    assert [(loc.name, loc.splits, loc.roi, loc.dates) for loc in found.locations] == [
        ("alta", ("train", "val", "test"), RoiId("ROIs9000", 1), 40)
    ]
    assert {split: [loc.name for loc in found.split(split)] for split in ("train", "val", "test")} == {
        "train": ["alta"],
        "val": ["alta"],
        "test": ["alta"],
    }
    assert found.temporal == temporal_ranges(TEMPORAL)


def test_with_a_temporal_split_a_mapping_may_name_a_location_in_several_splits(folder):
    """oslo (2019-03-01..03-26) trains and tests; tromso (118 dates) is in all three."""
    temporal = {"val": ["2019-05-01", "2019-05-31"], "test": ["2019-03-01", "2019-03-31"], "gap_days": 10}
    locations = {"train": ["tromso"], "val": ["tromso"], "test": ["oslo", "tromso"]}
    found = folder_locations(_config(folder, locations=locations, temporal_split=temporal))
    assert [(loc.name, loc.splits) for loc in found.locations] == [
        ("oslo", ("test",)),
        ("tromso", ("train", "val", "test")),
    ]
    assert [loc.name for loc in found.split("test")] == ["oslo", "tromso"]
    assert [loc.roi for loc in found.locations] == [RoiId("ROIs9000", 1), RoiId("ROIs9000", 2)]
    locations["test"] = ["oslo", "oslo"]
    _refused(_config(folder, locations=locations, temporal_split=temporal), "data.locations.test: 'oslo' listed twice")


def test_a_list_of_locations_needs_a_temporal_split(tmp_path):
    _location(tmp_path / "mine", "alta", 40)
    _refused(
        _config(tmp_path / "mine", locations=["alta"]),
        "data.locations: a list puts every location in every split, which needs data.temporal_split (its dates "
        "split by date ranges); else give {train: [...], val: [...], test: [...]}",
    )
    _refused(
        _config(tmp_path / "mine", locations=[], temporal_split=TEMPORAL),
        "data.locations: no location; name at least one sub-folder of data.folder",
    )
    _refused(
        _config(tmp_path / "mine", locations=["alta", "narvik"], temporal_split=TEMPORAL),
        f"data.locations: 'narvik': no folder {tmp_path / 'mine' / 'narvik'}",
    )


def test_a_bad_temporal_split_is_one_line_naming_the_key(tmp_path):
    _location(tmp_path / "mine", "alta", 40)
    spec = {**TEMPORAL, "test": ["2019-05-20", "2019-06-30"]}
    _refused(
        _config(tmp_path / "mine", locations=["alta"], temporal_split=spec),
        "data.temporal_split.test: 2019-05-20..2019-06-30 overlaps val 2019-05-01..2019-05-31; keep them more "
        "than gap_days (10) days apart",
    )


def test_a_temporal_split_beside_another_source_is_one_line(folder):
    from vcloud.data.locations import folder_source

    with pytest.raises(ConfigError) as err:
        folder_source({"data": {"source": "sen12mscrts", "temporal_split": TEMPORAL}})
    assert str(err.value) == (
        "data.temporal_split: read only with data.source: folder (now sen12mscrts); add data.source: folder or "
        "remove data.temporal_split"
    )


def test_a_split_that_leaves_a_location_too_few_dates_is_one_line_naming_both(tmp_path):
    """Each split of each location needs MIN_DATES S2 dates in its range, counted on the file names
    (a multi-tile location: its tile with the most, as its series length is counted)."""
    root = tmp_path / "mine"
    _location(root, "alta", 40)
    _location(root, "bodo", 12, tiles=("east", "west"))  # 2019-03-01 .. 2019-04-25: none in May
    config = _config(root, locations=["alta", "bodo"], temporal_split=TEMPORAL)
    _refused(
        config,
        "data.temporal_split.val: 'bodo' has 0 of its 12 S2 dates there (2019-05-01..2019-05-31); each split needs "
        "at least 2 of every location's (a clear target and another date): move or widen the ranges",
    )
    # one date in val: 2019-05-03..05-07 holds only 05-05 of alta's (every 5 days from 03-01)
    config = _config(root, locations=["alta"], temporal_split={**TEMPORAL, "val": ["2019-05-03", "2019-05-07"]})
    _refused(
        config,
        "data.temporal_split.val: 'alta' has 1 of its 40 S2 dates there (2019-05-03..2019-05-07); each split needs "
        "at least 2 of every location's (a clear target and another date): move or widen the ranges",
    )
    # training: every date but those within 10 days of val and test: alta's 2019-03-01 alone
    spec = {**TEMPORAL, "val": ["2019-03-16", "2019-04-20"], "test": ["2019-05-01", "2019-09-30"]}
    _refused(
        _config(root, locations=["alta"], temporal_split=spec),
        "data.temporal_split.train: 'alta' has 1 of its 40 S2 dates there (every date but 2019-03-06..2019-04-30, "
        "2019-04-21..2019-10-10); each split needs at least 2 of every location's (a clear target and another date): "
        "move or widen the ranges",
    )
    # a tile without val dates beside one with them: the location has its dates there
    _location(root, "east", 40, tiles=("a",))
    for day in range(2):  # tile b: two dates only, in March
        path = root / "east" / "b" / "S2" / f"T32TQM_201903{day + 1:02d}.tif"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    assert [
        loc.dates for loc in folder_locations(_config(root, locations=["east"], temporal_split=TEMPORAL)).locations
    ] == [40]


def test_the_schema_takes_a_temporal_split_and_names_a_bad_key():
    import datetime as dt

    errors = _schema_errors

    dates = {"val": [dt.date(2019, 5, 1), dt.date(2019, 5, 31)], "test": ["2019-08-01", "2019-08-31"]}
    assert errors(locations=["alta"], temporal_split={**dates, "gap_days": 10}) is None  # YAML dates or text
    assert (
        errors(locations=["alta"], temporal_split={**dates, "gap_days": 10, "train": ["2019-01-01", "2019-04-01"]})
        is None
    )
    assert errors(locations=["alta"], temporal_split=dates) == "missing key data.temporal_split.gap_days"
    assert errors(locations=["alta"], temporal_split={**dates, "gap_days": -1}) == (
        "key data.temporal_split.gap_days: -1 is less than the minimum of 0"
    )
    assert errors(locations=["alta"], temporal_split={**dates, "gap_days": 1, "holdout": []}) == (
        "unknown key data.temporal_split.holdout (allowed: gap_days, test, train, val)"
    )
    assert errors(locations=["a b"]) == "key data.locations.0: 'a b' does not match '^[A-Za-z0-9][A-Za-z0-9_.-]*$'"
    assert errors(locations=[]) == "key data.locations: [] should be non-empty"


# --- the protocols on your own imagery --------------------------------------------------------


@pytest.fixture(scope="module")
def own_store(tiny_raw_master, tmp_path_factory):
    """A store of a plain folder with SCL/ (tests/unit/test_cloud_masks.py's series, without S1)."""
    from tests.unit.test_cloud_masks import _scl_layers
    from tests.unit.test_folder import S2_DATES, _images, _write
    from vcloud.data.prepare import prepare_roi

    root = tmp_path_factory.mktemp("own") / "mine"
    s2 = _images(tiny_raw_master, "s2")
    for (data, georef), date, layer in zip(s2, S2_DATES, _scl_layers()):
        _write(root / "S2" / f"T32TQM_{date}.tif", data, georef)
        _write(root / "SCL" / f"SCL_{date}.tif", layer[None], georef)
    out = root.parent / "mine.zarr"
    prepare_roi(raw=root, roi=RoiId("ROIs9000", 1), out=out, times=4, size=32)
    return out


def test_the_uncrtaints_protocol_is_not_run_on_your_own_imagery(own_store, small):
    from vcloud.evaluation.evaluate import uncrtaints_samples
    from vcloud.evaluation.uncrtaints import UncrtaintsSamples

    reason = (
        f"{own_store}: your own imagery (a plain folder), not SEN12MS-CR-TS: the uncrtaints protocol is that "
        "dataset's (its sampler over the dataset's series, its regions and released pairing), so it is not run; "
        "the fixed and reference protocols score this store"
    )
    with pytest.raises(BadInputError) as err:
        UncrtaintsSamples(own_store, dates=2)
    assert str(err.value) == reason
    assert uncrtaints_samples(own_store, small) == reason  # vcloud evaluate: reported as not run


def test_a_split_takes_one_source(tiny_raw_master, tiny_store, tmp_path):
    from tests.unit.test_folder import S2_DATES, _images, _write
    from vcloud.data.prepare import prepare_roi
    from vcloud.data.store import assemble

    root = tmp_path / "mine"  # s2cloudless's mask, as tiny_store's: only the source differs
    for (data, georef), date in zip(_images(tiny_raw_master, "s2"), S2_DATES):
        _write(root / "S2" / f"T32TQM_{date}.tif", data, georef)
    own = tmp_path / "mine.zarr"
    prepare_roi(raw=root, roi=RoiId("ROIs9000", 1), out=own, times=4, size=32)
    with pytest.raises(BadInputError, match=r"a split takes SEN12MS-CR-TS or your own imagery, not both$"):
        assemble([tiny_store, own], tmp_path / "mixed.zarr")
    assert not (tmp_path / "mixed.zarr").exists()


def test_a_series_of_three_dates_feeds_a_model_of_four_input_dates(tiny_raw_master, tmp_path, small):
    """A location of 3 dates in a store of 6 (a longer location beside it sets the time axis), under
    the small config's T = 4: every sampler repeats its dates, never reads an absent one."""
    from tests.unit.test_cloud_masks import _scl_layers
    from tests.unit.test_folder import S2_DATES, _images, _write
    from vcloud.data.prepare import prepare_roi
    from vcloud.data.samples import CloudySamples
    from vcloud.evaluation.protocols import reference_samples

    root = tmp_path / "short"
    s2 = _images(tiny_raw_master, "s2")
    # dates 0 (clear), 1 (thick) and 2 (thin, all cirrus)
    for (data, georef), date, layer in list(zip(s2, S2_DATES, _scl_layers()))[:3]:
        _write(root / "S2" / f"T32TQM_{date}.tif", data, georef)
        _write(root / "SCL" / f"SCL_{date}.tif", layer[None], georef)
    store = tmp_path / "short.zarr"
    prepare_roi(raw=root, roi=RoiId("ROIs9000", 1), out=store, times=6, size=32)
    assert small.data.input_dates == 4
    cloudy = CloudySamples(store, dates=small.data.input_dates, seed=0, clear_max_cover=0.05)
    for index in range(8):
        _, target, dates, slot, _ = cloudy.pick(index)
        assert target == 0 and dates[slot] == 0 and len(dates) == 4 and set(dates) <= {0, 1, 2}
        assert cloudy[index]["x"].shape[0] == 4
    reference = reference_samples(store, small)
    assert len(reference) == 1
    _, truth, dates, _, _ = reference.items[0]
    assert truth == 0 and len(dates) == 4 and set(dates) <= {1, 2}
    assert reference[0]["x"].shape[0] == 4
