/* Renderers of the Monte Carlo products charts (service/products/dashboard.py answers their JSON).
 *
 *   mc-spectra      mean pseudo-spectra TT, EE, BB with a band of one realisation's scatter (log y)
 *   mc-noise-bias   N_l TT, EE, BB with its scatter (log y)
 *   mc-transfer     F_l TT, EE, BB with its scatter (linear y, a reference line at 1)
 *   mc-transfer-matrix
 *                   the E/B transfer matrix's elements per bin on a symlog y axis, error bars as the
 *                   bandpowers', bins above 2 nside dashed (not reliable)
 *   mc-bandpowers, mc-bandpower-transfer, mc-bandpower-noise
 *                   decoupled bandpowers (D_b), F_b or N_b: points joined by lines, vertical error bars
 *                   (two-point lines of class "errbar"), the input model dashed (class "model"), and a
 *                   button above the chart that switches the y axis between log and linear
 *
 * The JSON is MapCampaign.charts.lines options plus the aggregates' generation. Colours are set through
 * element.style (CSSOM, allowed by the page's Content-Security-Policy); after drawing, the running-mean
 * images of the panel are pointed at the generation the chart shows, so they follow the aggregates live
 * (and the panel's note is updated).
 */
"use strict";

(function () {
  const root = (window.MapCampaign = window.MapCampaign || {});
  const COLOURS = {
    TT: "#1f5fa8", EE: "#c2410c", BB: "#15803d",
    "EE<-EE": "#c2410c", "BB<-BB": "#15803d", "BB<-EE": "#7c3aed", "EE<-BB": "#b45309", "EB<-EE": "#0e7490",
    "EB<-BB": "#6b7280",
  };

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

  function legend(svg, series, step) {
    const charts = root.charts;
    let x = 70;
    for (const s of series) {
      const swatch = charts.node("rect", { x: x, y: 4, width: 12, height: 4 }, svg);
      swatch.style.fill = COLOURS[s.label] || "#555";
      charts.text(svg, x + 16, 10, s.label, { class: "legend-label" });
      x += step || 48;
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

  /* Bandpower charts: a series' error bars are drawn as one two-point line per bin (lo to hi), so the
   * shared MapCampaign.charts.lines draws them on its own scales; the model is a dashed line. */
  function bandpowerSeries(data) {
    const number = (v) => (v === null || v === undefined ? NaN : v);
    const series = [];
    for (const s of data.series || []) {
      const y = s.y.map(number);
      const kind = s.model ? "model" : "data";
      series.push({
        label: s.label, x: s.x, y: y, kind: kind,
        cls: `mc-${s.label} ${kind}`,
        title: s.model ? `${s.label} input model` : `${s.label} over ${data.n} realisation(s)`,
      });
      if (s.lo && s.hi) {
        s.x.forEach((x, i) => {
          const lo = number(s.lo[i]), hi = number(s.hi[i]);
          if (!Number.isFinite(lo) || !Number.isFinite(hi)) return;
          series.push({ label: s.label, x: [x, x], y: [lo, hi], kind: "errbar", cls: `mc-${s.label} errbar` });
        });
      }
    }
    return series;
  }

  function drawBandpowers(element, data, logY) {
    let toggle = element.previousElementSibling;
    if (!toggle || !toggle.classList.contains("axis-toggle")) {
      toggle = document.createElement("button");
      toggle.type = "button";
      toggle.className = "axis-toggle";
      element.parentNode.insertBefore(toggle, element);
      // One listener for the chart's life: it redraws the latest data with the other axis.
      toggle.addEventListener("click", () => drawBandpowers(element, element.bandpowerData, element.dataset.logY !== "true"));
    }
    element.bandpowerData = data;
    toggle.textContent = logY ? "linear y axis" : "log y axis";
    toggle.setAttribute("aria-pressed", logY ? "true" : "false");
    element.dataset.logY = logY ? "true" : "false";
    const series = bandpowerSeries(data);
    if (data.reference !== null && data.reference !== undefined && series.length) {
      const x = series[0].x;
      series.push({ label: "ref", x: [x[0], x[x.length - 1]], y: [data.reference, data.reference], kind: "ref", cls: "mc-ref" });
    }
    const svg = root.charts.lines(element, {
      series: series, logY: logY, xLabel: data.xLabel, yLabel: data.yLabel, label: data.label,
      emptyMessage: "No bandpowers yet.",
    });
    if (svg) {
      for (const s of series) {
        if (s.kind === "ref") continue;
        const value = COLOURS[s.label] || "#555";
        for (const line of svg.querySelectorAll(`polyline.mc-${s.label}`)) {
          line.style.stroke = value;
          line.style.strokeWidth = line.classList.contains("errbar") ? "1.5" : "2";
          if (line.classList.contains("model")) line.style.strokeDasharray = "6 4";
        }
      }
      for (const line of svg.querySelectorAll(".mc-ref")) {
        line.style.stroke = "#6b7280";
        line.style.strokeDasharray = "4 4";
      }
      legend(svg, series.filter((s) => s.kind === "data"));
    }
    refreshPanel(data.generation, data.note);
  }

  /* The transfer matrix: each element's points joined over the reliable bins (solid) and over the bins
   * above 2 nside (dashed, class "unreliable"), with error bars; symlog y from the JSON's threshold. */
  function drawMatrix(element, data) {
    const number = (v) => (v === null || v === undefined ? NaN : v);
    const reliable = data.reliable || [];
    const series = [];
    for (const s of data.series || []) {
      const y = s.y.map(number);
      const cls = "mc-" + s.label.replace("<-", "-from-");
      series.push({ label: s.label, x: s.x, y: y.map((v, i) => (reliable[i] === false ? NaN : v)), kind: "data", cls: cls,
                    title: `${s.label} over ${data.n} realisation(s)` });
      const last = reliable.indexOf(false);
      if (last > 0) {
        // from the last reliable bin on, so the dashed part joins the solid one
        series.push({ label: s.label, x: s.x, y: y.map((v, i) => (i >= last - 1 ? v : NaN)), kind: "unreliable",
                      cls: cls + " unreliable", title: `${s.label} above 2 nside (not reliable)` });
      }
      if (s.lo && s.hi) {
        s.x.forEach((x, i) => {
          const lo = number(s.lo[i]), hi = number(s.hi[i]);
          if (!Number.isFinite(lo) || !Number.isFinite(hi)) return;
          series.push({ label: s.label, x: [x, x], y: [lo, hi], kind: "errbar", cls: cls + " errbar" });
        });
      }
    }
    const svg = root.charts.lines(element, {
      series: series, symlog: data.symlog, xLabel: data.xLabel, yLabel: data.yLabel, label: data.label,
      emptyMessage: data.note || "No transfer matrix yet.",
    });
    if (svg) {
      for (const s of series) {
        for (const line of svg.querySelectorAll(`polyline.${s.cls.split(" ")[0]}`)) {
          line.style.stroke = COLOURS[s.label] || "#555";
          line.style.strokeWidth = line.classList.contains("errbar") ? "1.5" : "2";
          if (line.classList.contains("unreliable")) line.style.strokeDasharray = "5 4";
        }
      }
      legend(svg, series.filter((s) => s.kind === "data"), 76);
    }
    // No refreshPanel: the matrix's generation is of two campaigns, not of this campaign's mean map.
  }

  function register() {
    if (!root.charts || !root.charts.register) return;
    root.charts.register("mc-spectra", (element, data) => draw(element, data));
    root.charts.register("mc-noise-bias", (element, data) => draw(element, data));
    root.charts.register("mc-transfer", (element, data) => draw(element, data, 1));
    root.charts.register("mc-transfer-matrix", (element, data) => drawMatrix(element, data));
    for (const kind of ["mc-bandpowers", "mc-bandpower-transfer", "mc-bandpower-noise"]) {
      root.charts.register(kind, (element, data) => {
        const chosen = element.dataset.logY;  // a redraw after a new result keeps the reader's choice
        drawBandpowers(element, data, chosen === undefined ? !!data.logY : chosen === "true");
      });
    }
  }

  register();
})();
