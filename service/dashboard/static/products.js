/* Renderers of the Monte Carlo products charts (service/products/dashboard.py answers their JSON).
 *
 *   mc-bandpowers, mc-bandpower-transfer, mc-bandpower-noise
 *                   decoupled bandpowers (D_b), the transfer function F_b or the noise bias N_b: points
 *                   joined by lines, vertical error bars (two-point lines of class "errbar"), the input
 *                   model dashed (class "model"), a reference line at F_b = 1
 *   mc-spectra      mean pseudo-spectra TT, EE, BB with a band of one realisation's scatter
 *   mc-noise-bias   pseudo-C_l noise N_l with its scatter
 *   mc-transfer     the pseudo-C_l ratio F_l (a full-sky approximation) with its scatter
 *   mc-transfer-matrix
 *                   the E/B transfer matrix's elements per bin (labelled input→output) with error bars,
 *                   drawn as the bandpowers are, on a symlog axis
 *
 * Every chart: bins the JSON flags (``flagged``: above 2 nside, or F_b poorly determined) are hollow
 * circles of class "unreliable", kept out of the line and of the axis range; the x range above 2 nside
 * is a grey band (``shade``); a button cycles the y axis through the JSON's ``scales`` (linear, log,
 * symlog); dragging across a chart zooms its x range (the y range follows the bins inside), and "reset
 * zoom" undoes it. The reader's scale and zoom survive the redraw after each new result.
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
    "E→E": "#c2410c", "B→B": "#15803d", "E→B": "#7c3aed", "B→E": "#b45309", "E→EB": "#0e7490", "B→EB": "#6b7280",
  };
  const SCALE_NAMES = { linear: "linear y axis", log: "log y axis", symlog: "symlog y axis" };

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

  const number = (v) => (v === null || v === undefined ? NaN : v);

  /* The series MapCampaign.charts.lines draws. Bandpower charts: a series' error bars are one two-point
   * line per bin (lo to hi, none on a flagged bin), so they share the chart's scales; the model is a
   * dashed line. Pseudo-C_l charts: a band of one realisation's scatter. */
  function chartSeries(data, bars) {
    const series = [];
    for (const s of data.series || []) {
      const kind = s.model ? "model" : "data";
      const flagged = s.flagged || undefined;
      const y = s.y.map(number);
      const lo = s.lo ? s.lo.map(number) : undefined, hi = s.hi ? s.hi.map(number) : undefined;
      series.push({
        label: s.label, x: s.x, y: y, kind: kind, flagged: flagged,
        lo: bars ? undefined : lo, hi: bars ? undefined : hi, bandCls: `mc-${s.label}`,
        cls: `mc-${s.label} ${kind}`,
        title: s.model ? `${s.label} input model` : `${s.label} over ${data.n} realisation(s)`,
      });
      if (bars && lo && hi) {
        s.x.forEach((x, i) => {
          if (flagged && flagged[i]) return;
          if (!Number.isFinite(lo[i]) || !Number.isFinite(hi[i])) return;
          series.push({ label: s.label, x: [x, x], y: [lo[i], hi[i]], kind: "errbar", cls: `mc-${s.label} errbar` });
        });
      }
    }
    if (data.reference !== null && data.reference !== undefined && series.length) {
      const x = series[0].x;
      series.push({ label: "ref", x: [x[0], x[x.length - 1]], y: [data.reference, data.reference], kind: "ref", cls: "mc-ref", title: "F = 1" });
    }
    return series;
  }

  function colour(svg, series) {
    for (const s of series) {
      if (s.kind === "ref") continue;
      const value = COLOURS[s.label] || "#555";
      for (const element of svg.querySelectorAll(`.mc-${s.label}`)) {
        const tag = element.tagName.toLowerCase();
        if (tag === "polygon") {
          element.style.fill = value;
          element.style.opacity = "0.18";
          continue;
        }
        element.style.stroke = value;
        if (tag === "circle") continue;
        element.style.opacity = "0.95";
        element.style.strokeWidth = element.classList.contains("errbar") ? "1.5" : "2";
        if (element.classList.contains("model")) element.style.strokeDasharray = "6 4";
      }
    }
    for (const line of svg.querySelectorAll(".mc-ref")) {
      line.style.stroke = "#6b7280";
      line.style.strokeDasharray = "4 4";
    }
  }

  function controls(element) {
    let bar = element.previousElementSibling;
    if (bar && bar.classList.contains("chart-controls")) return bar;
    bar = document.createElement("div");
    bar.className = "chart-controls";
    const toggle = document.createElement("button");
    toggle.type = "button";
    toggle.className = "axis-toggle";
    const reset = document.createElement("button");
    reset.type = "button";
    reset.className = "zoom-reset";
    reset.textContent = "reset zoom";
    const hint = document.createElement("span");
    hint.className = "muted small";
    hint.textContent = "drag across the chart to zoom";
    bar.append(toggle, reset, hint);
    element.parentNode.insertBefore(bar, element);
    // One listener each for the chart's life: they redraw the latest data.
    toggle.addEventListener("click", () => {
      const scales = element.chartData.scales || [];
      const next = scales[(scales.indexOf(element.dataset.yScale) + 1) % scales.length];
      element.dataset.yScale = next;
      redraw(element);
    });
    reset.addEventListener("click", () => {
      delete element.dataset.xRange;
      redraw(element);
    });
    return bar;
  }

  function redraw(element) {
    const data = element.chartData;
    const matrix = element.dataset.chart === "mc-transfer-matrix";
    const bars = matrix || element.dataset.chart.startsWith("mc-bandpower");
    const bar = controls(element);
    const scales = data.scales || [data.yScale || "linear"];
    if (!scales.includes(element.dataset.yScale)) element.dataset.yScale = data.yScale || scales[0];
    const scale = element.dataset.yScale;
    const toggle = bar.querySelector("button.axis-toggle");
    const next = scales[(scales.indexOf(scale) + 1) % scales.length];
    toggle.textContent = SCALE_NAMES[next] || next;
    toggle.hidden = scales.length < 2;
    const range = element.dataset.xRange ? element.dataset.xRange.split(",").map(Number) : undefined;
    bar.querySelector("button.zoom-reset").hidden = !range;
    const series = chartSeries(data, bars);
    const svg = root.charts.lines(element, {
      series: series, yScale: scale, xRange: range, shade: data.shade, xLabel: data.xLabel, yLabel: data.yLabel,
      label: data.label,
      emptyMessage: matrix ? data.note || "No transfer matrix yet." : bars ? "No bandpowers yet." : "No spectra yet.",
      onZoom: (chosen) => {
        element.dataset.xRange = chosen.map((v) => v.toFixed(2)).join(",");
        redraw(element);
      },
    });
    if (svg) {
      colour(svg, series);
      legend(svg, series.filter((s) => s.kind === "data"), matrix ? 60 : 48);
    }
    // The matrix's generation is of two campaigns, not of this campaign's mean map.
    if (!matrix) refreshPanel(data.generation, data.note);
  }

  function render(element, data) {
    element.chartData = data;  // a redraw after a new result keeps the reader's scale and zoom
    redraw(element);
  }

  function register() {
    if (!root.charts || !root.charts.register) return;
    for (const kind of ["mc-spectra", "mc-noise-bias", "mc-transfer", "mc-bandpowers", "mc-bandpower-transfer", "mc-bandpower-noise",
                        "mc-transfer-matrix"]) {
      root.charts.register(kind, render);
    }
  }

  register();
})();
