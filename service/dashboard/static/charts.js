/* Small SVG charts for the dashboard: progress bars, stacked bars, lines on linear, log or symlog axes.
 *
 * Every label is set with textContent and every number with setAttribute: no HTML is parsed from data.
 * Charts draw into a viewBox and scale with their container.
 *
 *   MapCampaign.charts.stackedBars(element, {slots, items, keys, yLabel})
 *   MapCampaign.charts.lines(element, {series, yScale, xRange, shade, xLabel, yLabel})   lo/hi bands,
 *                                                                        flagged points, drag to zoom
 *   MapCampaign.charts.register(kind, (element, data) => ...)            renderers for [data-chart] elements
 *   MapCampaign.charts.renderRegistered(root)                            fetch each [data-src], draw it
 */
"use strict";

(function () {
  const NS = "http://www.w3.org/2000/svg"; // the SVG namespace name, not a download
  const root = (window.MapCampaign = window.MapCampaign || {});

  function node(name, attrs, parent) {
    const element = document.createElementNS(NS, name);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value !== undefined && value !== null) element.setAttribute(key, String(value));
    }
    if (parent) parent.appendChild(element);
    return element;
  }

  function text(parent, x, y, content, attrs) {
    const element = node("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    element.textContent = content;
    return element;
  }

  function titled(element, content) {
    const title = node("title", {}, element);
    title.textContent = content;
    return element;
  }

  function empty(container, message) {
    container.replaceChildren();
    const paragraph = document.createElement("p");
    paragraph.className = "empty";
    paragraph.textContent = message || container.dataset.empty || "No data.";
    container.appendChild(paragraph);
  }

  /* Round tick values from at or below `low` to at or above `high`. */
  function niceTicks(low, high, count) {
    if (!(high > low)) high = low + 1;
    const raw = (high - low) / Math.max(count, 1);
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((s) => s >= raw) || raw;
    const ticks = [];
    const first = Math.floor(low / step + 1e-9), last = Math.ceil(high / step - 1e-9);
    for (let k = first; k <= last; k++) ticks.push(Number((k * step).toPrecision(12)));
    return ticks;
  }

  function formatNumber(value) {
    const magnitude = Math.abs(value);
    if (magnitude === 0) return "0";
    if (magnitude >= 1e4 || magnitude < 1e-2) return value.toExponential(0);
    return String(Number(value.toPrecision(3)));
  }

  function frame(container, width, height, margin, label) {
    container.replaceChildren();
    const svg = node("svg", {
      viewBox: `0 0 ${width} ${height}`,
      role: "img",
      "aria-label": label || "",
      preserveAspectRatio: "xMidYMid meet",
    });
    container.appendChild(svg);
    const plot = { x: margin.left, y: margin.top, w: width - margin.left - margin.right, h: height - margin.top - margin.bottom };
    return { svg: svg, plot: plot };
  }

  function legend(svg, x, y, entries) {
    let offset = x;
    for (const entry of entries) {
      node("rect", { x: offset, y: y - 9, width: 10, height: 10, class: "legend-swatch " + entry.cls }, svg);
      const label = text(svg, offset + 14, y, entry.label);
      offset += 30 + 7 * entry.label.length;
      label.setAttribute("class", "legend-label");
    }
  }

  /* Stacked bars, one per slot (a realisation index); a slot with no item stays empty.
   *   slots: [index, ...]   items: [{slot, parts: {key: value}, title}]   keys: [{key, label, cls}] */
  function stackedBars(container, options) {
    const items = options.items || [];
    if (!items.length) return empty(container, options.emptyMessage);
    const width = options.width || 960, height = options.height || 280;
    const margin = { left: 58, right: 12, top: 26, bottom: 38 };
    const { svg, plot } = frame(container, width, height, margin, options.label);
    const slots = options.slots;
    const totals = items.map((item) => options.keys.reduce((sum, key) => sum + (item.parts[key.key] || 0), 0));
    const top = Math.max(...totals, 1e-9);
    const ticks = niceTicks(0, top, 5);
    const yMax = ticks[ticks.length - 1] || top;
    const y = (value) => plot.y + plot.h - (value / yMax) * plot.h;
    const slotWidth = plot.w / slots.length;
    const barWidth = Math.max(slotWidth * 0.8, 0.6);
    const axis = node("g", { class: "axis" }, svg);
    for (const tick of ticks) {
      node("line", { x1: plot.x, x2: plot.x + plot.w, y1: y(tick), y2: y(tick), class: "grid-line" }, svg);
      text(axis, plot.x - 6, y(tick) + 4, formatNumber(tick), { "text-anchor": "end" });
    }
    node("line", { x1: plot.x, x2: plot.x + plot.w, y1: plot.y + plot.h, y2: plot.y + plot.h }, axis);
    const position = new Map(slots.map((slot, i) => [slot, i]));
    const labelEvery = Math.max(1, Math.ceil(slots.length / 10));
    slots.forEach((slot, i) => {
      if (i % labelEvery === 0) text(axis, plot.x + (i + 0.5) * slotWidth, plot.y + plot.h + 14, String(slot), { "text-anchor": "middle" });
    });
    const bars = node("g", {}, svg);
    items.forEach((item) => {
      const i = position.get(item.slot);
      if (i === undefined) return;
      const group = titled(node("g", { class: "bar-group", "data-slot": item.slot }, bars), item.title || String(item.slot));
      let base = 0;
      for (const key of options.keys) {
        const value = item.parts[key.key] || 0;
        if (value <= 0) continue;
        node("rect", {
          x: (plot.x + i * slotWidth + (slotWidth - barWidth) / 2).toFixed(2),
          y: y(base + value).toFixed(2),
          width: barWidth.toFixed(2),
          height: Math.max(y(base) - y(base + value), 0).toFixed(2),
          class: key.cls,
        }, group);
        base += value;
      }
    });
    if (options.yLabel) text(svg, 14, plot.y + plot.h / 2, options.yLabel, { class: "axis-label", transform: `rotate(-90 14 ${plot.y + plot.h / 2})`, "text-anchor": "middle" });
    if (options.xLabel) text(svg, plot.x + plot.w / 2, height - 4, options.xLabel, { class: "axis-label", "text-anchor": "middle" });
    legend(svg, plot.x, 14, options.keys);
    return svg;
  }

  /* The y axis transforms: "linear", "log" (log10; non-positive values are dropped) and "symlog"
   * (sign(v) log10(1 + |v|): linear near zero, logarithmic in both directions, so values of either sign
   * spanning decades stay readable). */
  const SCALES = {
    linear: { to: (v) => v, usable: (v) => Number.isFinite(v) },
    log: { to: (v) => Math.log10(v), usable: (v) => Number.isFinite(v) && v > 0 },
    symlog: { to: (v) => Math.sign(v) * Math.log10(1 + Math.abs(v)), usable: (v) => Number.isFinite(v) },
  };

  function symlogTicks(low, high) {
    const ticks = [];
    for (let e = 0; e <= 12; e++) {
      for (const value of e === 0 ? [0, 1, -1] : [Math.pow(10, e), -Math.pow(10, e)]) {
        const t = SCALES.symlog.to(value);
        if (t >= low - 1e-9 && t <= high + 1e-9) ticks.push({ at: t, label: formatNumber(value) });
      }
    }
    return ticks.sort((a, b) => a.at - b.at);
  }

  /* Lines on a linear, log or symlog y axis (options.yScale; options.logY is "log").
   *   series: [{label, x: [...], y: [...], lo?: [...], hi?: [...], cls?, title?,
   *             flagged?: [bool]}]   flagged points (unreliable) are drawn as hollow circles of class
   *                                  "unreliable", left out of the line and of the axis range (kept
   *                                  inside it: a value off the range sits on its edge)
   *   shade: [{from, to, label}]     x ranges drawn as a grey band of class "unreliable-region"
   *   xRange: [lo, hi]               the x range to show (zoom); y is set by what lies inside it
   *   xInteger: true                 x ticks only at whole numbers
   *   onZoom: (range|null) => ...    dragging across the plot calls it with the x range chosen */
  function lines(container, options) {
    const series = (options.series || []).filter((s) => s.y && s.y.length);
    if (!series.length) return empty(container, options.emptyMessage);
    const width = options.width || 960, height = options.height || 280;
    const margin = { left: 58, right: 14, top: 14, bottom: 38 };
    const { svg, plot } = frame(container, width, height, margin, options.label);
    const scaleName = options.yScale || (options.logY ? "log" : "linear");
    const scale = SCALES[scaleName] || SCALES.linear;
    const ty = scale.to;
    const usable = scale.usable;
    const xOf = (s, i) => (s.x ? s.x[i] : i);
    const range = options.xRange;
    const inRange = (x) => !range || (x >= range[0] && x <= range[1]);
    let xLow = Infinity, xHigh = -Infinity, yLow = Infinity, yHigh = -Infinity;
    for (const s of series) {
      s.y.forEach((value, i) => {
        const xs = xOf(s, i);
        if (!inRange(xs)) return;
        xLow = Math.min(xLow, xs);
        xHigh = Math.max(xHigh, xs);
        if (s.flagged && s.flagged[i]) return;
        for (const v of [value, s.lo && s.lo[i], s.hi && s.hi[i]]) {
          if (v === undefined || v === null || !usable(v)) continue;
          yLow = Math.min(yLow, ty(v));
          yHigh = Math.max(yHigh, ty(v));
        }
      });
    }
    if (range) {
      xLow = range[0];
      xHigh = range[1];
    }
    if (!Number.isFinite(yLow)) return empty(container, options.emptyMessage);
    if (xHigh === xLow) xHigh = xLow + 1;
    let ticks;
    if (scaleName === "log") {
      yLow = Math.floor(yLow);
      yHigh = Math.max(Math.ceil(yHigh), yLow + 1);
      const stride = Math.max(1, Math.ceil((yHigh - yLow) / 8));
      ticks = [];
      for (let e = yLow; e <= yHigh; e += stride) ticks.push({ at: e, label: "1e" + e });
    } else if (scaleName === "symlog") {
      yLow = Math.min(Math.floor(yLow * 2) / 2, 0);
      yHigh = Math.max(Math.ceil(yHigh * 2) / 2, yLow + 0.5);
      ticks = symlogTicks(yLow, yHigh);
    } else {
      const values = niceTicks(yLow, yHigh, 5);
      yLow = Math.min(yLow, values[0]);
      yHigh = Math.max(yHigh, values[values.length - 1]);
      if (yHigh === yLow) yHigh = yLow + 1;
      ticks = values.map((v) => ({ at: v, label: formatNumber(v) }));
    }
    const px = (value) => plot.x + ((value - xLow) / (xHigh - xLow)) * plot.w;
    const py = (value) => plot.y + plot.h - ((Math.min(Math.max(value, yLow), yHigh) - yLow) / (yHigh - yLow)) * plot.h;
    svg.dataset.yScale = scaleName;
    svg.dataset.yLow = String(yLow);
    svg.dataset.yHigh = String(yHigh);
    svg.dataset.xLow = String(xLow);
    svg.dataset.xHigh = String(xHigh);
    for (const region of options.shade || []) {
      const from = Math.max(region.from, xLow), to = Math.min(region.to, xHigh);
      if (!(to > from)) continue;
      const band = node("rect", {
        x: px(from).toFixed(2), y: plot.y, width: (px(to) - px(from)).toFixed(2), height: plot.h, class: "unreliable-region",
      }, svg);
      titled(band, region.label || "");
      if (region.label) text(svg, px(from) + 4, plot.y + 12, region.label, { class: "region-label" });
    }
    const axis = node("g", { class: "axis" }, svg);
    for (const tick of ticks) {
      node("line", { x1: plot.x, x2: plot.x + plot.w, y1: py(tick.at), y2: py(tick.at), class: "grid-line" }, svg);
      text(axis, plot.x - 6, py(tick.at) + 4, tick.label, { "text-anchor": "end" });
    }
    for (const tick of niceTicks(xLow, xHigh, 8)) {
      if (tick < xLow || tick > xHigh) continue;
      if (options.xInteger && !Number.isInteger(tick)) continue;
      text(axis, px(tick), plot.y + plot.h + 14, formatNumber(tick), { "text-anchor": "middle" });
    }
    node("line", { x1: plot.x, x2: plot.x + plot.w, y1: plot.y + plot.h, y2: plot.y + plot.h }, axis);
    node("line", { x1: plot.x, x2: plot.x, y1: plot.y, y2: plot.y + plot.h }, axis);
    const drawn = node("g", {}, svg);
    for (const s of series) {
      const shown = (i) => inRange(xOf(s, i)) && !(s.flagged && s.flagged[i]);
      if (s.lo && s.hi) {
        const upper = [], lower = [];
        s.y.forEach((_, i) => {
          if (shown(i) && usable(s.lo[i]) && usable(s.hi[i])) {
            upper.push(`${px(xOf(s, i)).toFixed(2)},${py(ty(s.hi[i])).toFixed(2)}`);
            lower.unshift(`${px(xOf(s, i)).toFixed(2)},${py(ty(s.lo[i])).toFixed(2)}`);
          }
        });
        if (upper.length) node("polygon", { points: upper.concat(lower).join(" "), class: "band " + (s.bandCls || "") }, drawn);
      }
      const points = [];
      s.y.forEach((value, i) => {
        if (shown(i) && usable(value)) points.push(`${px(xOf(s, i)).toFixed(2)},${py(ty(value)).toFixed(2)}`);
      });
      const line = node("polyline", { points: points.join(" "), class: "line " + (s.cls || "") }, drawn);
      if (s.label !== undefined) line.setAttribute("data-series", s.label);
      titled(line, s.title || s.label || "");
      if (!s.flagged) continue;
      s.y.forEach((value, i) => {
        if (!s.flagged[i] || !inRange(xOf(s, i)) || !usable(value)) return;
        const marker = node("circle", {
          cx: px(xOf(s, i)).toFixed(2), cy: py(ty(value)).toFixed(2), r: 3.5,
          class: "unreliable " + (s.cls || ""), "data-series": s.label, "data-x": xOf(s, i),
        }, drawn);
        titled(marker, `${s.label} at ${xOf(s, i)}: ${formatNumber(value)} (unreliable, not in the axis range)`);
      });
    }
    if (options.yLabel) text(svg, 14, plot.y + plot.h / 2, options.yLabel, { class: "axis-label", transform: `rotate(-90 14 ${plot.y + plot.h / 2})`, "text-anchor": "middle" });
    if (options.xLabel) text(svg, plot.x + plot.w / 2, height - 4, options.xLabel, { class: "axis-label", "text-anchor": "middle" });
    if (options.onZoom) brush(svg, plot, width, xLow, xHigh, options.onZoom);
    return svg;
  }

  /* Drag across the plot to choose an x range: onZoom(range) with the data values under the drag. */
  function brush(svg, plot, width, xLow, xHigh, onZoom) {
    let start = null;
    const selection = node("rect", { y: plot.y, height: plot.h, width: 0, class: "zoom-selection" }, svg);
    const toUser = (event) => {
      const box = svg.getBoundingClientRect();
      return ((event.clientX - box.left) / box.width) * width;
    };
    const toData = (u) => xLow + ((Math.min(Math.max(u, plot.x), plot.x + plot.w) - plot.x) / plot.w) * (xHigh - xLow);
    svg.addEventListener("mousedown", (event) => {
      start = toUser(event);
      selection.setAttribute("x", start.toFixed(2));
      selection.setAttribute("width", "0");
      event.preventDefault();
    });
    svg.addEventListener("mousemove", (event) => {
      if (start === null) return;
      const now = toUser(event);
      selection.setAttribute("x", Math.min(start, now).toFixed(2));
      selection.setAttribute("width", Math.abs(now - start).toFixed(2));
    });
    svg.addEventListener("mouseup", (event) => {
      if (start === null) return;
      const a = toData(start), b = toData(toUser(event));
      start = null;
      selection.setAttribute("width", "0");
      if (Math.abs(b - a) > (xHigh - xLow) / 100) onZoom([Math.min(a, b), Math.max(a, b)]);
    });
  }

  /* The progress bar made by the page template: move its rectangles to new counts. */
  function progress(svg, counts, total) {
    const parts = [
      ["succeeded", counts.succeeded], ["failed", counts.failed], ["cancelled", counts.cancelled],
      ["running", counts.running + counts.claimed], ["queued", counts.queued],
    ];
    let x = 0;
    for (const [name, count] of parts) {
      const width = total ? (1000 * count) / total : 0;
      const rect = svg.querySelector(`[data-part="${name}"]`);
      if (rect) {
        rect.setAttribute("x", x.toFixed(2));
        rect.setAttribute("width", width.toFixed(2));
      }
      x += width;
    }
    svg.setAttribute("aria-label",
      `${counts.succeeded} succeeded, ${counts.running + counts.claimed} running, ${counts.failed} failed, ${counts.queued} queued of ${total}`);
  }

  const renderers = new Map();

  function register(kind, renderer) {
    renderers.set(kind, renderer);
  }

  /* Draw every [data-chart][data-src] below root with the renderer registered for its kind. */
  async function renderRegistered(scope) {
    const elements = (scope || document).querySelectorAll("[data-chart][data-src]");
    for (const element of elements) {
      const renderer = renderers.get(element.dataset.chart);
      if (!renderer) {
        empty(element, "No renderer for this chart yet.");
        continue;
      }
      try {
        const answer = await fetch(element.dataset.src, { credentials: "same-origin", headers: { Accept: "application/json" } });
        if (!answer.ok) throw new Error(String(answer.status));
        renderer(element, await answer.json());
      } catch (error) {
        empty(element, "Could not load this chart.");
      }
    }
  }

  root.charts = { node, text, empty, niceTicks, formatNumber, stackedBars, lines, progress, register, renderRegistered };
})();
