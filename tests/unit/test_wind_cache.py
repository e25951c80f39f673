"""Wind-scanner cache: exact orders, window orders for crops, the npz file and its checks."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest

from vcloud.cli import main
from vcloud.errors import BadInputError, ConfigError
from vcloud.wind.scan_orders import (
    FORMAT_VERSION,
    TIE_RULE,
    compute_cache,
    get_scan_orders,
    global_order,
    load_cache,
    scan_keys,
    sector_angles,
    sector_from_wind,
    window_orders,
    write_cache,
)

TOPOFLOW = {"grid_h": 64, "grid_w": 128, "sectors": 16}
SMALL = {"grid_h": 4, "grid_w": 8, "sectors": 8}


@pytest.fixture(scope="module")
def topoflow():
    return compute_cache(**TOPOFLOW)


def float_projection(grid_h: int, grid_w: int, angle: float) -> np.ndarray:
    """TopoFlow's float projection of the row-major patches (the reference, not the key)."""
    rows, cols = np.divmod(np.arange(grid_h * grid_w), grid_w)
    x = cols / (grid_w - 1) * 2 - 1 if grid_w > 1 else np.zeros(grid_h * grid_w)
    y = -(rows / (grid_h - 1) * 2 - 1) if grid_h > 1 else np.zeros(grid_h * grid_w)
    return x * math.cos(angle) + y * math.sin(angle)


def is_permutation(rows: np.ndarray) -> bool:
    n = rows.shape[-1]
    return bool((np.sort(rows, axis=-1) == np.arange(n)).all())


# --- orders ----------------------------------------------------------------------------


def test_every_order_is_a_permutation(topoflow):
    assert topoflow.orders.shape == (16, 64 * 128)
    assert is_permutation(topoflow.orders)


def test_projection_is_monotone_along_every_order(topoflow):
    for s, angle in enumerate(sector_angles(16)):
        order = topoflow.orders[s]
        assert (np.diff(float_projection(64, 128, angle)[order]) >= -1e-12).all(), s
        keys = scan_keys(64, 128, angle)[order]
        steps = np.diff(keys)
        assert (steps >= 0).all(), s
        assert (np.diff(order)[steps == 0] > 0).all(), f"sector {s}: ties not by ascending index"


def test_orders_match_float_sort_where_floats_are_well_separated(topoflow):
    # Rounding the float projection to 1e-9 removes the 1e-16 noise that makes plain float
    # sorts machine-dependent; the exact key must give the same order as the true values.
    for s, angle in enumerate(sector_angles(16)):
        rounded = np.round(float_projection(64, 128, angle), 9)
        expected = np.lexsort((np.arange(rounded.size), rounded))
        np.testing.assert_array_equal(topoflow.orders[s], expected, err_msg=f"sector {s}")


def test_inverse_composes_to_identity(topoflow):
    n = 64 * 128
    for s in range(16):
        np.testing.assert_array_equal(topoflow.orders[s][topoflow.inverse[s]], np.arange(n))
        np.testing.assert_array_equal(topoflow.inverse[s][topoflow.orders[s]], np.arange(n))


@pytest.mark.parametrize("sectors", [4, 8, 16])
@pytest.mark.parametrize("delta", [1e-12, -1e-12])
def test_orders_are_stable_under_angle_perturbation(sectors, delta):
    for angle in sector_angles(sectors):
        np.testing.assert_array_equal(global_order(64, 128, angle + delta), global_order(64, 128, angle))


def test_axis_aligned_and_diagonal_ties_on_3x4_by_hand():
    # Row-major indices of a 3x4 grid:   0  1  2  3   (top, y = +1)
    #                                    4  5  6  7
    #                                    8  9 10 11   (bottom, y = -1)
    cache = compute_cache(grid_h=3, grid_w=4, sectors=8)
    expected = {
        0: [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11],  # east: west column first, ties top-down
        2: [8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3],  # north: bottom row first
        4: [3, 7, 11, 2, 6, 10, 1, 5, 9, 0, 4, 8],  # west: east column first
        6: list(range(12)),  # south: top row first
        # north-east, projection ~ x + y with x = (2col-3)/3, y = 1-row: 0 and 11 tie at 0
        1: [8, 9, 4, 10, 5, 0, 11, 6, 1, 7, 2, 3],
        # north-west, projection ~ y - x: 3 and 8 tie at 0
        3: [11, 10, 7, 9, 6, 3, 8, 5, 2, 4, 1, 0],
    }
    for sector, order in expected.items():
        assert cache.orders[sector].tolist() == order, sector
    assert "ascending row-major index" in TIE_RULE
    assert "ascending row-major index" in cache.meta["tie_rule"]


def test_single_row_or_column_grids():
    row = compute_cache(grid_h=1, grid_w=5, sectors=4)
    assert row.orders.tolist() == [
        [0, 1, 2, 3, 4],
        [0, 1, 2, 3, 4],
        [4, 3, 2, 1, 0],
        [0, 1, 2, 3, 4],
    ]
    column = compute_cache(grid_h=3, grid_w=1, sectors=4)
    assert column.orders.tolist() == [[0, 1, 2], [2, 1, 0], [0, 1, 2], [0, 1, 2]]


def test_window_orders_on_4x8_by_hand():
    orders = compute_cache(**SMALL).orders
    # Window-local indices of a 2x4 window:  0 1 2 3 / 4 5 6 7.
    # North-east uses the grid's aspect: key ~ 3*(2col-7) + 7*(3-2row) = 6col - 14row (+0).
    expected = {
        0: [0, 4, 1, 5, 2, 6, 3, 7],  # east
        1: [4, 5, 6, 0, 7, 1, 2, 3],  # north-east: keys -14 -8 -2 0 4 6 12 18
        2: [4, 5, 6, 7, 0, 1, 2, 3],  # north
        4: [3, 7, 2, 6, 1, 5, 0, 4],  # west
    }
    window = window_orders(orders, (4, 8), (2, 4))
    for sector, order in expected.items():
        assert window[sector].tolist() == order, sector


@pytest.mark.parametrize("window", [(3, 3), (5, 7), (1, 4), (8, 8)])
def test_every_window_of_a_shape_scans_in_the_same_order(window):
    # What lets a random training crop use the whole patch's orders: the global key
    # restricted to any h x w window at any offset sorts it as the top-left window does.
    grid, sectors = (8, 8), 16
    orders = compute_cache(grid_h=8, grid_w=8, sectors=sectors).orders
    h, w = window
    local = window_orders(orders, grid, window)  # (S, h*w)
    assert is_permutation(local)
    for s, angle in enumerate(sector_angles(sectors)):
        keys = scan_keys(*grid, angle)
        for r0 in range(grid[0] - h + 1):
            for c0 in range(grid[1] - w + 1):
                rows, cols = np.divmod(np.arange(h * w), w)
                global_idx = (rows + r0) * grid[1] + cols + c0
                expected = np.lexsort((np.arange(h * w), keys[global_idx]))
                assert local[s].tolist() == expected.tolist(), (s, r0, c0)


def test_window_larger_than_the_grid_is_refused():
    orders = compute_cache(**SMALL).orders
    with pytest.raises(ConfigError, match="window 5x4 does not fit the wind cache's grid 4x8"):
        window_orders(orders, (4, 8), (5, 4))


# --- arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"grid_h": 0}, "--grid-h"),
        ({"grid_w": -3}, "--grid-w"),
        ({"sectors": 0}, "--sectors"),
        ({"grid_h": 2**16, "grid_w": 2**16}, "--grid-h/--grid-w"),
    ],
)
def test_bad_arguments_name_the_option(tmp_path, kwargs, option):
    with pytest.raises(ConfigError, match=option):
        write_cache(tmp_path / "w.npz", **{**SMALL, **kwargs})


# --- file ------------------------------------------------------------------------------


def test_file_round_trip_and_meta(tmp_path):
    path = tmp_path / "wind" / "scan_orders.npz"
    write_cache(path, **TOPOFLOW)
    assert sorted(p.name for p in path.parent.iterdir()) == ["scan_orders.npz"]
    cache = load_cache(path, **TOPOFLOW)
    expected = compute_cache(**TOPOFLOW)
    for name in ("orders", "inverse"):
        array = getattr(cache, name)
        assert array.dtype == np.int64
        np.testing.assert_array_equal(array, getattr(expected, name))
    assert cache.meta["grid"] == [64, 128]
    assert cache.meta["sectors"] == 16
    assert cache.meta["format_version"] == FORMAT_VERSION
    assert cache.meta["checksum_sha256"] == expected.meta["checksum_sha256"]
    assert "counter-clockwise" in cache.meta["angle_convention"]
    assert cache.grid == (64, 128) and cache.sectors == 16
    with np.load(path, allow_pickle=False) as npz:
        assert sorted(npz.files) == ["inverse", "meta", "orders"]  # no regional orders (v2)


def test_stored_dtypes_are_the_smallest_unsigned(tmp_path):
    cases = [
        (TOPOFLOW, np.uint16),  # 8192 patches
        ({"grid_h": 16, "grid_w": 16, "sectors": 4}, np.uint8),
        ({"grid_h": 1, "grid_w": 300, "sectors": 4}, np.uint16),
    ]
    for i, (kwargs, global_dtype) in enumerate(cases):
        path = tmp_path / f"w{i}.npz"
        write_cache(path, **kwargs)
        with np.load(path, allow_pickle=False) as npz:
            assert npz["orders"].dtype == global_dtype
            assert npz["inverse"].dtype == global_dtype
            assert npz["meta"].dtype.kind == "U"


def rewrite(path, *, meta_changes=None, array_changes=None):
    with np.load(path, allow_pickle=False) as npz:
        content = {name: npz[name] for name in npz.files}
    meta = json.loads(str(content["meta"]))
    meta.update(meta_changes or {})
    content.update(array_changes or {})
    content["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(path, **content)


def test_changed_array_value_fails_the_checksum(tmp_path):
    path = tmp_path / "w.npz"
    write_cache(path, **SMALL)
    orders = load_cache(path, **SMALL).orders.astype(np.uint8)
    orders[0, [0, 1]] = orders[0, [1, 0]]  # still a permutation, but not the one written
    rewrite(path, array_changes={"orders": orders})
    with pytest.raises(BadInputError, match="checksum") as err:
        load_cache(path, **SMALL)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_edited_meta_layout_fails_the_checksum(tmp_path):
    path = tmp_path / "w.npz"
    write_cache(path, **SMALL)
    rewrite(path, meta_changes={"grid": [8, 4]})
    with pytest.raises(BadInputError, match="checksum"):
        load_cache(path, **{**SMALL, "grid_h": 8, "grid_w": 4})


def test_inverse_that_is_not_the_inverse_is_refused_even_with_a_valid_checksum(tmp_path):
    from vcloud.wind.scan_orders import _checksum  # a buggy writer would sign its own mistake

    path = tmp_path / "w.npz"
    write_cache(path, **SMALL)
    with np.load(path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files if name != "meta"}
    arrays["inverse"] = arrays["orders"].copy()  # a permutation, but not the inverse
    checksum = _checksum(arrays, (4, 8), 8)
    rewrite(path, meta_changes={"checksum_sha256": checksum}, array_changes=arrays)
    with pytest.raises(BadInputError, match="inverse is not the inverse of orders"):
        load_cache(path, **SMALL)


def test_flipped_byte_is_reported_as_corrupt(tmp_path):
    path = tmp_path / "w.npz"
    write_cache(path, **SMALL)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(BadInputError) as err:
        load_cache(path, **SMALL)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_not_an_npz_is_reported(tmp_path):
    path = tmp_path / "w.npz"
    path.write_text("hello")
    with pytest.raises(BadInputError, match="not a readable wind cache"):
        load_cache(path, **SMALL)


@pytest.mark.parametrize(
    ("expected", "message"),
    [
        ({"grid_h": 8, "grid_w": 16}, "grid 4x8 in the file, model config wants 8x16"),
        ({"sectors": 16}, "8 sectors in the file, model config wants 16"),
    ],
)
def test_mismatch_errors_name_the_file(tmp_path, expected, message):
    path = tmp_path / "scan_orders.npz"
    write_cache(path, **SMALL)
    with pytest.raises(ConfigError) as err:
        load_cache(path, **{**SMALL, **expected})
    assert str(err.value) == f"{path}: {message}"


def test_version_mismatch_names_the_file(tmp_path):
    path = tmp_path / "w.npz"
    write_cache(path, **SMALL)
    rewrite(path, meta_changes={"format_version": FORMAT_VERSION + 1})
    with pytest.raises(ConfigError, match="version") as err:
        load_cache(path, **SMALL)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def test_format_version_1_cache_is_refused_with_one_line(tmp_path):
    # A cache written before regional orders were dropped: v1 meta, four arrays.
    path = tmp_path / "scan_orders.npz"
    orders = compute_cache(**SMALL).orders.astype(np.uint8)
    meta = {
        "format": "vcloud-wind-cache",
        "format_version": 1,
        "grid": [4, 8],
        "sectors": 8,
        "regions": [2, 2],
        "checksum_sha256": "0" * 64,
    }
    np.savez_compressed(
        path,
        orders=orders,
        inverse=np.argsort(orders, axis=1).astype(np.uint8),
        regional_orders=np.zeros((4, 8, 8), np.uint8),
        regional_inverse=np.zeros((4, 8, 8), np.uint8),
        meta=np.array(json.dumps(meta)),
    )
    with pytest.raises(ConfigError) as err:
        load_cache(path, **SMALL)
    message = str(err.value)
    assert message.startswith(f"{path}: format 'vcloud-wind-cache' version 1 in the file")
    assert f"version {FORMAT_VERSION}" in message and "rerun `vcloud wind-cache" in message
    assert "\n" not in message


def test_missing_file_names_the_file(tmp_path):
    path = tmp_path / "nowhere.npz"
    with pytest.raises(BadInputError) as err:
        load_cache(path, **SMALL)
    assert str(err.value).startswith(f"{path}: wind cache not found")


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "w.npz"
    write_cache(path, **SMALL)
    before = path.read_bytes()

    def broken(handle, **arrays):
        handle.write(b"half a file")
        raise RuntimeError("disk full")

    monkeypatch.setattr(np, "savez_compressed", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        write_cache(path, **{**SMALL, "sectors": 4})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["w.npz"]


# --- get_scan_orders -------------------------------------------------------------------


def test_never_recomputes_under_ddp(tmp_path):
    path = tmp_path / "missing.npz"
    with pytest.raises(BadInputError, match="world size is 2") as err:
        get_scan_orders(path, **SMALL, world_size=2, allow_recompute=True)
    assert str(path) in str(err.value)
    assert not path.exists()


def test_single_process_recomputes_only_when_allowed(tmp_path, caplog):
    path = tmp_path / "missing.npz"
    with pytest.raises(BadInputError, match="not found"):
        get_scan_orders(path, **SMALL, world_size=1, allow_recompute=False)
    with caplog.at_level(logging.WARNING, logger="vcloud.wind.scan_orders"):
        cache = get_scan_orders(path, **SMALL, world_size=1, allow_recompute=True)
    assert "computing scan orders in memory" in caplog.text
    np.testing.assert_array_equal(cache.orders, compute_cache(**SMALL).orders)
    assert not path.exists()  # an in-memory fallback never writes


def test_existing_file_is_loaded_and_checked_under_ddp(tmp_path):
    path = tmp_path / "w.npz"
    write_cache(path, **SMALL)
    cache = get_scan_orders(path, **SMALL, world_size=8, allow_recompute=False)
    assert cache.orders.shape == (8, 32)
    with pytest.raises(ConfigError, match="sectors"):
        get_scan_orders(path, **{**SMALL, "sectors": 4}, world_size=1, allow_recompute=True)


# --- CLI -------------------------------------------------------------------------------


def test_cli_writes_a_loadable_cache(tmp_path):
    path = tmp_path / "results" / "wind" / "scan_orders.npz"
    argv = ["wind-cache", "--out", str(path), "--grid-h", "4", "--grid-w", "8"]
    assert main([*argv, "--sectors", "8"]) == 0
    assert load_cache(path, **SMALL).orders.shape == (8, 32)


def test_cli_bad_option_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "w.npz"
    argv = ["wind-cache", "--out", str(path), "--grid-h", "4", "--grid-w", "8"]
    assert main([*argv, "--sectors", "0"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--sectors" in lines[0] and "0" in lines[0]
    assert not path.exists()


# --- sector_from_wind ------------------------------------------------------------------


def test_sector_from_wind():
    u = np.array([1.0, 0.0, -1.0, 0.0, 1.0, 1.0, math.cos(-0.3), 0.0, np.nan, 2.0])
    v = np.array([0.0, 1.0, 0.0, -1.0, 1.0, -0.01, math.sin(-0.3), 0.0, 1.0, np.inf])
    assert sector_from_wind(u, v, 16).tolist() == [0, 4, 8, 12, 2, 0, 15, -1, -1, -1]
    assert sector_from_wind(3.0, 3.0, 8).shape == ()
    assert int(sector_from_wind(3.0, 3.0, 8)) == 1
    assert sector_from_wind(np.ones((2, 3)), 0.0, 4).shape == (2, 3)
    with pytest.raises(ConfigError, match="sectors"):
        sector_from_wind(1.0, 0.0, 0)
