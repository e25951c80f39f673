// vcloud viewer: plain browser JavaScript, no libraries, no network. The data is the JSON in
// #viewer-data; the selected sample and layers live in the URL hash (#sample=12&a=stage3&b=truth)
// so that a view can be linked, from file:// as well as from a server.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("viewer-data").textContent);
  var samples = data.samples;
  var byIndex = {};
  samples.forEach(function (s) { byIndex[s.index] = s; });
  var layerInfo = {};
  data.layers.forEach(function (l) { layerInfo[l.key] = l; });
  var swipeLayers = data.layers.filter(function (l) { return l.swipe; });
  var metricNames = ["psnr", "ssim", "sam", "mae", "rmse"];
  var metricLabels = { psnr: "PSNR dB", ssim: "SSIM", sam: "SAM deg", mae: "MAE", rmse: "RMSE" };
  // Opens on the pipeline's output (its last stage in the registry, the page's sort order).
  var state = { sample: null, a: data.sort_method, b: "truth", mode: "swipe" };

  function $(id) { return document.getElementById(id); }

  function make(tag, props, children) {
    var node = document.createElement(tag);
    Object.keys(props || {}).forEach(function (key) {
      if (key === "text") { node.textContent = props[key]; }
      else if (key === "className") { node.className = props[key]; }
      else { node.setAttribute(key, props[key]); }
    });
    (children || []).forEach(function (child) { node.appendChild(child); });
    return node;
  }
  window.vcloudMake = make;  // for a page's other sections (experiments.js), inlined after this

  function psnr(sample) { return sample.metrics[data.sort_method].psnr; }

  function classRank(name) {
    var rank = data.cloud_classes.indexOf(name);
    return rank < 0 ? data.cloud_classes.length : rank;
  }

  function sorted(key) {
    var list = samples.slice();
    var compare = {
      "psnr-desc": function (x, y) { return psnr(y) - psnr(x) || x.index - y.index; },
      "psnr-asc": function (x, y) { return psnr(x) - psnr(y) || x.index - y.index; },
      "class": function (x, y) { return classRank(x.cloud_class) - classRank(y.cloud_class) || psnr(y) - psnr(x) || x.index - y.index; },
      "index": function (x, y) { return x.index - y.index; }
    }[key];
    list.sort(compare);
    return list;
  }

  function classBadge(name) { return make("span", { className: "cls cls-" + name, text: name }); }

  function renderGrid() {
    var grid = $("grid");
    grid.textContent = "";
    sorted($("sort").value).forEach(function (s) {
      var button = make("button", {
        type: "button", className: "card", "data-index": String(s.index),
        "data-psnr": String(psnr(s)), "data-class": s.cloud_class,
        title: s.location + " " + s.date
      }, [
        make("div", { className: "pair" }, [
          make("img", { src: s.images.input, alt: "sample " + s.index + " cloudy input", width: "64", height: "64" }),
          make("img", { src: s.images[data.sort_method], alt: "sample " + s.index + " " + layerInfo[data.sort_method].label, width: "64", height: "64" })
        ]),
        make("div", { className: "meta" }, [
          make("span", { text: "#" + s.index }),
          classBadge(s.cloud_class),
          make("span", { text: psnr(s).toFixed(2) + " dB" })
        ])
      ]);
      button.setAttribute("aria-current", String(state.sample === s.index));
      button.addEventListener("click", function () { select(s.index); });
      grid.appendChild(make("li", {}, [button]));
    });
    $("count").textContent = samples.length + " samples; PSNR of the " + layerInfo[data.sort_method].label;
  }

  function fillLayerSelect(select, value) {
    select.textContent = "";
    swipeLayers.forEach(function (l) {
      var option = make("option", { value: l.key, text: l.label });
      if (l.key === value) { option.selected = true; }
      select.appendChild(option);
    });
  }

  function renderMetrics(s) {
    var table = $("metrics");
    table.textContent = "";
    var head = make("tr", {}, [make("th", { text: "method" })]);
    metricNames.forEach(function (m) { head.appendChild(make("th", { text: metricLabels[m] })); });
    table.appendChild(make("thead", {}, [head]));
    var body = make("tbody");
    Object.keys(data.methods).forEach(function (method) {
      var row = make("tr", { "data-method": method }, [make("td", { text: data.methods[method] })]);
      metricNames.forEach(function (m) {
        var v = s.metrics[method][m];
        row.appendChild(make("td", { text: m === "psnr" || m === "sam" ? v.toFixed(2) : v.toFixed(4) }));
      });
      body.appendChild(row);
    });
    table.appendChild(body);
  }

  function renderLayers(s) {
    var box = $("layers");
    box.textContent = "";
    data.layers.forEach(function (l) {
      var caption = l.label;
      if (l.key === "context") {
        caption += ": " + s.context.map(function (c) { return (c.days > 0 ? "+" : "") + c.days + " d"; }).join(", ");
      }
      box.appendChild(make("figure", { "data-layer": l.key }, [
        make("img", { src: s.images[l.key], alt: l.label, className: l.swipe ? "" : "wide" }),
        make("figcaption", { text: caption })
      ]));
    });
  }

  function renderCompare() {
    var s = byIndex[state.sample];
    if (!s) { return; }
    $("swipe-a").src = s.images[state.a];
    $("swipe-a").alt = layerInfo[state.a].label;
    $("swipe-b").src = s.images[state.b];
    $("swipe-b").alt = layerInfo[state.b].label;
    $("side-a").src = s.images[state.a];
    $("side-a-label").textContent = layerInfo[state.a].label;
    $("side-b").src = s.images[state.b];
    $("side-b-label").textContent = layerInfo[state.b].label;
    $("swipe-view").hidden = state.mode !== "swipe";
    $("side-view").hidden = state.mode !== "side";
    moveSwipe();
  }

  function moveSwipe() {
    var position = Number($("swipe").value);
    // The left layer shows left of the line, the right layer right of it.
    $("swipe-a").style.clipPath = "inset(0 " + (100 - position) + "% 0 0)";
    $("swipe-line").style.left = position + "%";
  }

  function select(index) {
    var s = byIndex[index];
    if (!s) { return; }
    state.sample = index;
    $("detail").hidden = false;
    $("detail-title").textContent = "sample #" + s.index + ": " + s.location + ", " + s.date + ", ";
    $("detail-title").appendChild(classBadge(s.cloud_class));
    renderMetrics(s);
    renderLayers(s);
    renderCompare();
    Array.prototype.forEach.call(document.querySelectorAll(".card"), function (card) {
      card.setAttribute("aria-current", String(Number(card.getAttribute("data-index")) === index));
    });
    writeHash();
  }

  function writeHash() {
    var hash = "#sample=" + state.sample + "&a=" + state.a + "&b=" + state.b;
    if (location.hash !== hash) { history.replaceState(null, "", hash); }
  }

  function readHash() {
    var params = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (part) {
      var kv = part.split("=");
      if (kv.length === 2) { params[kv[0]] = decodeURIComponent(kv[1]); }
    });
    if (layerInfo[params.a] && layerInfo[params.a].swipe) { state.a = params.a; }
    if (layerInfo[params.b] && layerInfo[params.b].swipe) { state.b = params.b; }
    return params.sample !== undefined && byIndex[Number(params.sample)] ? Number(params.sample) : null;
  }

  // Each shown stage against the strongest simple answer, first thing on the page: the run's
  // evaluation reports (data.headlines) or, in a research run, the comparison's (formatted in Python).
  function renderHeadlines() {
    var opening = data.headlines || (data.comparison && data.comparison.headlines);
    if (!opening || !opening.lines.length) { return; }
    var box = make("section", { id: "strongest", "aria-labelledby": "strongest-title" }, [
      make("h2", { id: "strongest-title", text: opening.title }),
      make("ul", {}, opening.lines.map(function (line) { return make("li", { text: line }); })),
      make("p", { className: "note", text: opening.note })
    ]);
    $("stretch").parentNode.insertBefore(box, $("about"));
  }

  function init() {
    $("title").textContent = data.title;
    renderHeadlines();
    $("about").textContent = samples.length + " test samples of " + data.store + " (model set " +
      data.model_set + "); protocol " + data.protocol + ".";
    $("stretch").textContent = "Stretch: " + data.stretch + ".";
    var wanted = readHash();
    fillLayerSelect($("layer-a"), state.a);
    fillLayerSelect($("layer-b"), state.b);
    $("sort").addEventListener("change", renderGrid);
    $("layer-a").addEventListener("change", function (e) { state.a = e.target.value; renderCompare(); writeHash(); });
    $("layer-b").addEventListener("change", function (e) { state.b = e.target.value; renderCompare(); writeHash(); });
    $("swipe").addEventListener("input", moveSwipe);
    Array.prototype.forEach.call(document.querySelectorAll("input[name=mode]"), function (radio) {
      radio.addEventListener("change", function (e) { state.mode = e.target.value; renderCompare(); });
    });
    renderGrid();
    if (samples.length) { select(wanted !== null ? wanted : sorted($("sort").value)[0].index); }
  }

  init();
}());
