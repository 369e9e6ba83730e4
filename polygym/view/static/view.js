// polygym view: draws the embedded plotly figures and, for a run still being written, reloads
// when new rows arrive. Figures are JSON in <script type="application/json"> elements, read with
// JSON.parse: nothing from a run is ever evaluated as code.
(function () {
  "use strict";
  function draw() {
    if (typeof Plotly === "undefined") { return; }
    var holders = document.querySelectorAll("[data-figure]");
    for (var i = 0; i < holders.length; i++) {
      var source = document.getElementById(holders[i].getAttribute("data-figure"));
      if (!source) { continue; }
      var fig = JSON.parse(source.textContent);
      Plotly.newPlot(holders[i], fig.data, fig.layout, { displaylogo: false, responsive: true });
      holders[i].setAttribute("data-drawn", "1");
    }
  }
  function live() {
    var url = document.body.getAttribute("data-live-url");
    if (!url) { return; }
    var rows = document.body.getAttribute("data-live-rows");
    var polls = 0;
    var timer = setInterval(function () {
      polls += 1;
      if (polls > 43200) { clearInterval(timer); return; }  // a day of polling at most
      fetch(url, { cache: "no-store" }).then(function (r) { return r.json(); }).then(function (d) {
        if (String(d.version) !== rows) { window.location.reload(); }
        else if (!d.live) { clearInterval(timer); }
      }).catch(function () {});
    }, 2000);
  }
  function waiting() {
    var box = document.getElementById("progress");
    if (!box) { return; }
    var url = box.getAttribute("data-progress-url");
    var polls = 0;
    var timer = setInterval(function () {
      polls += 1;
      if (polls > 7200) { clearInterval(timer); return; }  // two hours of waiting at most
      fetch(url, { cache: "no-store" }).then(function (r) { return r.json(); }).then(function (d) {
        if (d.ready) { clearInterval(timer); window.location.reload(); return; }
        var lines = box.querySelectorAll("p.run-progress");
        var bars = box.querySelectorAll("progress");
        for (var i = 0; i < d.runs.length && i < lines.length; i++) {
          var r = d.runs[i];
          lines[i].textContent = r.run + ": " + (r.loaded ? r.rows + " rows read" : "reading, " + r.percent + "% (" + r.rows + " rows so far)");
          bars[i].value = r.percent;
        }
        box.querySelector("p.activity").textContent = (d.activity || "queued") + "\u2026";
      }).catch(function () {});
    }, 1000);
  }
  draw();
  live();
  waiting();
})();
