"""The viewer of the shared real pipeline run in headless Chromium, from file:// and over http.

Every image loads (naturalWidth > 0), the swipe slider moves the split, the grid sorts by PSNR
and by cloud class, layers can be picked, and the console stays free of errors.
"""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.browser

CLASS_ORDER = ["clear", "thin", "thick", "opaque"]


@pytest.fixture(scope="module")
def viewer(pipeline_run):
    work, _, _ = pipeline_run
    folder = work / "results/viewer"
    page = (folder / "index.html").read_text()
    data = json.loads(page.split('id="viewer-data">', 1)[1].split("</script>", 1)[0])
    assert data["samples"], "the viewer of the pipeline run has no sample"
    return folder, data


@pytest.fixture(params=["file", "http"])
def page(request, browser, viewer, serve):
    """The viewer opened in the browser, from disk or from a loopback http.server."""
    folder, data = viewer
    url = (folder / "index.html").as_uri() if request.param == "file" else serve(folder) + "index.html"
    browser.get_log("browser")  # forget what earlier pages logged
    browser.get(url)
    _wait(browser, "return document.readyState === 'complete' && document.querySelectorAll('.card').length > 0")
    yield browser, data, url
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, f"console errors on {url}: {errors}"


def _wait(browser, script, timeout=10):
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, timeout).until(lambda d: d.execute_script(script))


ALL_IMAGES_LOADED = (
    "const imgs = Array.from(document.images).filter(i => i.getAttribute('src'));"
    "return imgs.length > 0 && imgs.every(i => i.complete);"
)
BROKEN_IMAGES = (
    "return Array.from(document.images).filter(i => i.getAttribute('src'))"
    ".filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src'));"
)
SOURCES = "return Array.from(document.images).map(i => i.getAttribute('src')).filter(Boolean);"


def test_every_image_of_every_sample_loads(page):
    browser, data, _ = page
    seen = set()
    for card in browser.find_elements("css selector", ".card"):
        card.click()
        index = int(card.get_attribute("data-index"))
        _wait(browser, f"return location.hash.startsWith('#sample={index}&')")
        _wait(browser, ALL_IMAGES_LOADED)
        assert browser.execute_script(BROKEN_IMAGES) == [], f"sample {index}: images did not load"
        seen.update(browser.execute_script(SOURCES))
    expected = {path for sample in data["samples"] for path in sample["images"].values()}
    assert expected <= seen  # every quicklook of every sample was shown and loaded


def test_the_slider_moves_the_swipe_split(page):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    browser, _, _ = page
    slider = browser.find_element("id", "swipe")
    assert slider.get_attribute("value") == "50"
    width = slider.size["width"]
    ActionChains(browser).click_and_hold(slider).move_by_offset(-width // 4, 0).release().perform()
    value = int(slider.get_attribute("value"))
    assert 10 <= value <= 40, value  # dragged a quarter of the way to the left
    clip = browser.find_element("id", "swipe-a").value_of_css_property("clip-path")
    assert clip == f"inset(0px {100 - value}% 0px 0px)", clip
    assert browser.find_element("id", "swipe-line").value_of_css_property("left").endswith("px")
    slider.send_keys(Keys.END)
    assert slider.get_attribute("value") == "100"
    assert browser.find_element("id", "swipe-a").value_of_css_property("clip-path") == "inset(0px 0% 0px 0px)"


def test_any_two_layers_can_be_compared(page):
    from selenium.webdriver.support.ui import Select

    browser, data, _ = page
    assert browser.find_element("id", "swipe-view").is_displayed()
    assert not browser.find_element("id", "side-view").is_displayed()
    Select(browser.find_element("id", "layer-a")).select_by_value("input")
    Select(browser.find_element("id", "layer-b")).select_by_value("stage1")
    assert browser.find_element("id", "swipe-a").get_attribute("src").endswith("_input.png")
    assert browser.find_element("id", "swipe-b").get_attribute("src").endswith("_stage1.png")
    assert re.search(r"&a=input&b=stage1$", browser.execute_script("return location.hash"))
    browser.find_element("css selector", "input[name=mode][value=side]").click()
    assert browser.find_element("id", "side-view").is_displayed()
    assert not browser.find_element("id", "swipe-view").is_displayed()
    assert browser.find_element("id", "side-b").get_attribute("src").endswith("_stage1.png")
    _wait(browser, ALL_IMAGES_LOADED)
    assert browser.execute_script(BROKEN_IMAGES) == []
    rows = browser.find_elements("css selector", "#metrics tbody tr")
    assert [r.get_attribute("data-method") for r in rows] == list(data["methods"])


def test_the_grid_sorts_by_psnr_and_by_cloud_class(page):
    from selenium.webdriver.support.ui import Select

    browser, data, _ = page
    sort = Select(browser.find_element("id", "sort"))

    def grid(attribute):
        return [c.get_attribute(attribute) for c in browser.find_elements("css selector", ".card")]

    sort.select_by_value("psnr-asc")
    psnr = [float(v) for v in grid("data-psnr")]
    assert psnr == sorted(psnr) and len(psnr) == len(data["samples"])
    sort.select_by_value("psnr-desc")
    assert [float(v) for v in grid("data-psnr")] == sorted(psnr, reverse=True)
    sort.select_by_value("class")
    ranks = [CLASS_ORDER.index(c) for c in grid("data-class")]
    assert ranks == sorted(ranks)
    sort.select_by_value("index")
    indices = [int(v) for v in grid("data-index")]
    assert indices == sorted(s["index"] for s in data["samples"])


def test_a_link_opens_the_sample_and_layers_it_names(page):
    browser, data, url = page
    last = data["samples"][-1]["index"]
    browser.get(f"{url}#sample={last}&a=cloud&b=s1")
    browser.refresh()  # a fragment-only change does not reload the page by itself
    _wait(browser, "return document.querySelectorAll('.card').length > 0")
    assert browser.find_element("id", "detail-title").text.startswith(f"sample #{last}:")
    assert browser.find_element("id", "swipe-a").get_attribute("src").endswith(f"s{last:04d}_cloud.png")
    current = browser.find_element("css selector", ".card[aria-current=true]")
    assert int(current.get_attribute("data-index")) == last
