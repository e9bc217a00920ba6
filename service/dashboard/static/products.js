/* Renderers of the Monte Carlo products charts (service/products/dashboard.py answers their JSON).
 *
 *   mc-spectra      mean pseudo-spectra TT, EE, BB with a band of one realisation's scatter (log y)
 *   mc-noise-bias   N_l TT, EE, BB with its scatter (log y)
 *   mc-transfer     F_l TT, EE, BB with its scatter (linear y, a reference line at 1)
 *
 * The JSON is MapCampaign.charts.lines options plus the aggregates' generation. Colours are set through
 * element.style (CSSOM, allowed by the page's Content-Security-Policy); after drawing, the running-mean
 * images of the panel are pointed at the generation the chart shows, so they follow the aggregates live
 * (and the panel's note is updated).
 */
"use strict";

(function () {
  const root = (window.MapCampaign = window.MapCampaign || {});
  const COLOURS = { TT: "#1f5fa8", EE: "#c2410c", BB: "#15803d" };

  function colour(svg, series) {
    for (const s of series) {
      const value = COLOURS[s.label] || "#555";
      for (const element of svg.querySelectorAll(`.mc-${s.label}`)) {
        if (element.tagName.toLowerCase() === "polygon") {
          element.style.fill = value;
          element.style.opacity = "0.18";
        } else {
          element.style.stroke = value;
          element.style.strokeWidth = "2";
          element.style.opacity = "0.95";
        }
      }
    }
  }

  function legend(svg, series) {
    const charts = root.charts;
    let x = 70;
    for (const s of series) {
      const swatch = charts.node("rect", { x: x, y: 4, width: 12, height: 4 }, svg);
      swatch.style.fill = COLOURS[s.label] || "#555";
      charts.text(svg, x + 16, 10, s.label, { class: "legend-label" });
      x += 48;
    }
  }

  function refreshPanel(generation, note) {
    const panel = document.getElementById("products-panel");
    if (!panel || generation === undefined) return;
    const noteElement = panel.querySelector("p.small");
    if (noteElement && note) noteElement.textContent = note;
    for (const image of panel.querySelectorAll("img")) {
      const source = image.getAttribute("src") || "";
      if (!/\/products\/mean-[IQU]\.png/.test(source)) continue;
      const next = source.replace(/\?g=\d+$/, "") + "?g=" + String(generation);
      if (next !== source) image.setAttribute("src", next);
    }
  }

  function draw(element, data, reference) {
    const series = (data.series || []).map((s) => ({
      label: s.label, x: s.x, cls: s.cls, bandCls: s.bandCls,
      y: s.y.map((v) => (v === null ? NaN : v)),
      lo: s.lo ? s.lo.map((v) => (v === null ? NaN : v)) : undefined,
      hi: s.hi ? s.hi.map((v) => (v === null ? NaN : v)) : undefined,
      title: `${s.label} over ${data.n} realisation(s)`,
    }));
    if (reference !== undefined && series.length) {
      const x = series[0].x;
      series.push({ label: "ref", x: [x[0], x[x.length - 1]], y: [reference, reference], cls: "mc-ref", title: "F = 1" });
    }
    const svg = root.charts.lines(element, {
      series: series, logY: !!data.logY, xLabel: data.xLabel, yLabel: data.yLabel, label: data.label,
      emptyMessage: "No spectra yet.",
    });
    if (svg) {
      colour(svg, series.filter((s) => s.label !== "ref"));
      for (const line of svg.querySelectorAll(".mc-ref")) {
        line.style.stroke = "#6b7280";
        line.style.strokeDasharray = "4 4";
      }
      legend(svg, series.filter((s) => s.label !== "ref"));
    }
    refreshPanel(data.generation, data.note);
  }

  function register() {
    if (!root.charts || !root.charts.register) return;
    root.charts.register("mc-spectra", (element, data) => draw(element, data));
    root.charts.register("mc-noise-bias", (element, data) => draw(element, data));
    root.charts.register("mc-transfer", (element, data) => draw(element, data, 1));
  }

  register();
})();
