// vcloud viewer of a research run: the section "Experiments compared" above the samples (opening
// with every experiment's stages against the strongest simple answer, as results/compare.md). Inlined
// after viewer.js only when the page has a comparison (vcloud export-viewer --comparison). Every
// cell comes formatted from Python (vcloud.evaluation.compare.runs_tables, as in
// results/compare.md); this only lays the tables out.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("viewer-data").textContent);
  var comparison = data.comparison;
  if (!comparison) { return; }

  var make = window.vcloudMake;  // viewer.js's, inlined before this

  function table(stage) {
    var head = make("tr", {}, comparison.header.map(function (name) { return make("th", { text: name, scope: "col" }); }));
    var body = make("tbody", {}, stage.rows.map(function (row) {
      var classes = [row.split === comparison.decided_on ? "decided" : "reported"];
      if (row.experiment === comparison.baseline) { classes.push("baseline"); }
      return make("tr", { className: classes.join(" "), "data-split": row.split, "data-experiment": row.experiment },
        row.cells.map(function (cell) { return make("td", { text: cell }); }));
    }));
    return make("div", { className: "scroll" }, [
      make("table", { className: "runs", "data-stage": String(stage.stage) }, [make("thead", {}, [head]), body])
    ]);
  }

  var section = make("section", { id: "experiments", "aria-labelledby": "experiments-title" }, [
    make("h2", { id: "experiments-title", text: comparison.title })
  ]);
  if (comparison.strongest && comparison.strongest.length) {  // as results/compare.md opens
    section.appendChild(make("ul", { className: "strongest" }, comparison.strongest.map(function (line) {
      return make("li", { text: line });
    })));
  }
  comparison.notes.forEach(function (note) { section.appendChild(make("p", { className: "note", text: note })); });
  section.appendChild(make("p", { id: "shown-run", text: comparison.shown }));
  comparison.tables.forEach(function (stage) {
    section.appendChild(make("h3", { text: "Stage " + stage.stage }));
    section.appendChild(table(stage));
  });
  var main = document.querySelector("main");
  main.parentNode.insertBefore(section, main);
}());
