"""A research run's viewer in headless Chromium: the section "Experiments compared" shows one table
per stage with the cells of results/compare.md, the notes and the run the samples are of, above
the samples; a page without a comparison has no such section; the console stays free of errors.

The page is rendered from a comparison made by vcloud compare and one sample of tiny quicklooks:
no pipeline run is needed.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.test_viewer import _report
from vcloud.evaluation.compare import write_run_comparison
from vcloud.export import images as im
from vcloud.export.viewer import LAST, LAYERS, METHODS, comparison_section, render_page

pytestmark = pytest.mark.browser

METRICS = {"psnr": 30.0, "ssim": 0.9, "sam": 2.0, "mae": 0.01, "rmse": 0.02}


def _page(folder, *, comparison: bool):
    """index.html of one sample (8 x 8 quicklooks), with base against s1 over seeds 0 and 1 on stages 1
    and 2 (val and test) when `comparison`."""
    images = {}
    (folder / "images").mkdir(parents=True, exist_ok=True)
    for shade, layer in enumerate(LAYERS):
        images[layer.key] = f"images/s0000_{layer.key}.png"
        im.write_png(folder / images[layer.key], np.full((8, 8, 3), 20 * shade, np.uint8))
    sample = {
        "index": 0,
        "location": "ROIs1868_119_p0",
        "date": "2018-03-01",
        "cloud_class": "thick",
        "context": [{"date": "2018-02-20", "days": -9}],
        "images": images,
        "metrics": {method: METRICS for method in METHODS},
    }
    data = {
        "version": 1,
        "title": "vcloud viewer: test.zarr",
        "store": "results/prepared/test.zarr",
        "model_set": "tiny",
        "protocol": "fixed",
        "stretch": im.STRETCH_NOTE,
        "cloud_classes": ["clear", "thin", "thick", "opaque"],
        "layers": [{"key": layer.key, "label": layer.label, "swipe": layer.swipe} for layer in LAYERS],
        "methods": METHODS,
        "sort_method": LAST,
        "samples": [sample],
    }
    if comparison:
        reports, val_reports = [], []
        for stage in (1, 2):
            for experiment, gain in (("base", 0.0), ("s1", 1.0)):
                for seed in (0, 1):
                    name = f"{experiment}{seed}_{stage}"
                    values = [30.0 + gain * (seed + 1), 32.0 + seed]
                    reports.append((experiment, seed, _report(folder, f"t_{name}", values, stage)))
                    val_reports.append((experiment, seed, _report(folder, f"v_{name}", [20.0, 21.0 + gain], stage)))
        path = folder / "compare.json"
        write_run_comparison(
            reports, path, baseline="base", val_reports=val_reports, markdown_out=folder / "compare.md"
        )
        data["comparison"] = comparison_section(path, run=("base", "0"))
    (folder / "index.html").write_text(render_page(data), encoding="utf-8")
    return data


def _open(browser, folder):
    browser.get_log("browser")  # forget what earlier pages logged
    browser.get((folder / "index.html").as_uri())
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 10).until(
        lambda d: d.execute_script("return document.readyState === 'complete' && !!document.querySelector('.card')")
    )


def _errors(browser):
    return [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def test_the_comparison_table_is_shown_with_the_cells_of_compare_md(browser, tmp_path):
    data = _page(tmp_path, comparison=True)
    _open(browser, tmp_path)
    section = browser.find_element("id", "experiments")
    assert section.is_displayed()
    assert browser.find_element("css selector", "#experiments h2").text == "Experiments compared"
    # Above the samples.
    assert browser.execute_script("return document.getElementById('experiments').nextElementSibling.tagName") == "MAIN"
    notes = [p.text for p in browser.find_elements("css selector", "#experiments p.note")]
    assert notes == data["comparison"]["notes"] and "chosen on the val split" in notes[1]
    assert browser.find_element("id", "shown-run").text == (
        "The samples below are one run's: base, seed 0 (the baseline). The tables are every run's."
    )
    tables = browser.find_elements("css selector", "#experiments table.runs")
    assert [t.get_attribute("data-stage") for t in tables] == ["1", "2"]
    assert [h.text for h in browser.find_elements("css selector", "#experiments h3")] == ["Stage 1", "Stage 2"]
    # Every row as results/compare.md has it, cell for cell, in its order.
    markdown = (tmp_path / "compare.md").read_text().split("### Stage ")[1:]
    for table, text in zip(tables, markdown, strict=True):
        header = [th.text for th in table.find_elements("css selector", "thead th")]
        rows = [
            [td.text for td in tr.find_elements("css selector", "td")]
            for tr in table.find_elements("css selector", "tbody tr")
        ]
        lines = [line for line in text.splitlines() if line.startswith("|")]
        assert "| " + " | ".join(header) + " |" == lines[0]
        assert ["| " + " | ".join(row) + " |" for row in rows] == lines[2:]
    # Worked out by hand: stage 2, test: s1 gains 1 dB at seed 0 and 2 dB at seed 1, on sample 0 only
    # (seed means 31.5 and 32.5 against base's 31 and 31.5: differences 0.5 and 1).
    row = browser.find_element("css selector", "table.runs[data-stage='2'] tr[data-split='test'][data-experiment='s1']")
    cells = [td.text for td in row.find_elements("css selector", "td")]
    assert cells[:7] == ["fixed", "test", "s1", "2", "31.50", "32.50", "32.00 ± 0.71"]
    assert cells[7].startswith("+0.75 [") and "decided" not in row.get_attribute("class")
    decided = browser.find_elements("css selector", "table.runs tr.decided")
    assert decided and {r.get_attribute("data-split") for r in decided} == {"val"}
    assert not _errors(browser), _errors(browser)


def test_a_page_without_a_comparison_has_no_such_section(browser, tmp_path):
    _page(tmp_path, comparison=False)
    _open(browser, tmp_path)
    assert browser.find_elements("id", "experiments") == []
    assert len(browser.find_elements("css selector", ".card")) == 1
    assert not _errors(browser), _errors(browser)
