/* The campaign page: the realisation grid, progress, plans, failures, timing and convergence charts,
 * quick-look maps, all kept current from the event stream without reloading the page. */
"use strict";

(function () {
  const MC = window.MapCampaign;
  const data = MC.pageData();
  const id = data.campaign_id;
  const STATES = { q: "queued", c: "claimed", r: "running", s: "succeeded", f: "failed", x: "cancelled" };
  const TIMING_KEYS = [
    { key: "calc", label: "calc", cls: "bar-calc" },
    { key: "comm", label: "comm", cls: "bar-comm" },
    { key: "io", label: "io", cls: "bar-io" },
  ];

  /* ------------------------------------------------------------------ grid */

  const grid = document.getElementById("grid");
  const tip = document.getElementById("grid-tip");
  let cells = [];

  function drawGrid(states) {
    const fragment = document.createDocumentFragment();
    cells = new Array(states.length);
    for (let i = 0; i < states.length; i++) {
      const cell = document.createElement("span");
      cell.className = "cell s-" + (STATES[states[i]] || "queued");
      cell.dataset.i = i;
      cells[i] = cell;
      fragment.appendChild(cell);
    }
    grid.replaceChildren(fragment);
    grid.dataset.rendered = "true";
  }

  const STATE_NAMES = new Set(Object.values(STATES));

  function setCell(index, state) {
    if (!STATE_NAMES.has(state)) return;
    const cell = cells[index];
    if (cell) cell.className = "cell s-" + state;
    const row = document.querySelector(`table.realizations tr[data-index="${index}"]`);
    if (row) MC.setBadge(row.querySelector("[data-role=state]"), state);
  }

  function cellState(cell) {
    return cell.className.replace(/^cell s-/, "");
  }

  grid.addEventListener("click", (event) => {
    const cell = event.target.closest(".cell");
    if (cell) window.location.assign(`/campaigns/${id}/realizations/${cell.dataset.i}`);
  });
  grid.addEventListener("mouseover", (event) => {
    const cell = event.target.closest(".cell");
    if (cell) tip.textContent = `#${cell.dataset.i}: ${cellState(cell)}`;
  });
  grid.addEventListener("mouseleave", () => (tip.textContent = ""));

  drawGrid(grid.dataset.states || "");
  performance.mark("grid-rendered");

  const refreshGrid = MC.debounce(async () => {
    try {
      drawGrid((await MC.fetchJSON(`/ui/campaigns/${id}/grid`)).states);
    } catch (error) {
      /* the next event tries again */
    }
  }, 300);

  /* ------------------------------------------------------------------ status: progress, plans, failures, maps */

  const progressPanel = document.getElementById("progress-panel");

  function cellText(row, value, className) {
    const cell = document.createElement("td");
    if (className) cell.className = className;
    if (value instanceof Node) cell.appendChild(value);
    else cell.textContent = value;
    row.appendChild(cell);
    return cell;
  }

  function badge(state) {
    const element = document.createElement("span");
    MC.setBadge(element, state);
    return element;
  }

  function chip(failureClass) {
    const element = document.createElement("span");
    element.className = "chip f-" + failureClass;
    element.textContent = failureClass;
    return element;
  }

  function size(bytes) {
    if (bytes === null || bytes === undefined) return "–";
    let value = bytes;
    for (const unit of ["B", "kB", "MB", "GB", "TB"]) {
      if (value < 1000 || unit === "TB") return unit === "B" ? `${value} B` : `${value.toFixed(1)} ${unit}`;
      value /= 1000;
    }
    return `${bytes} B`;
  }

  function showPlans(plans) {
    const body = document.querySelector("#plans tbody");
    const rows = plans.map((plan) => {
      const row = document.createElement("tr");
      row.dataset.plan = plan.id;
      cellText(row, plan.site);
      const state = cellText(row, badge(plan.state));
      if (plan.last_error && plan.state !== "ready") {
        const why = document.createElement("div");
        why.className = "small error-text";
        why.textContent = plan.last_error;
        state.appendChild(why);
      }
      cellText(row, MC.format.duration(plan.build_time_s));
      cellText(row, size(plan.size_bytes));
      const used = cellText(row, "");
      const here = document.createElement("b");
      here.textContent = plan.uses_here;
      const all = document.createElement("span");
      all.className = "muted";
      all.textContent = ` (${plan.uses} in all)`;
      used.append(here, " of this campaign", all);
      return row;
    });
    if (!rows.length) {
      const row = document.createElement("tr");
      row.className = "empty-row";
      cellText(row, "No plan yet: the first worker to claim this campaign builds it.").colSpan = 5;
      rows.push(row);
    }
    body.replaceChildren(...rows);
  }

  function showFailures(failures) {
    const classes = document.getElementById("failure-classes");
    const entries = Object.entries(failures.by_class).sort();
    if (!entries.length) {
      const none = document.createElement("span");
      none.className = "muted";
      none.textContent = "No failed attempts.";
      classes.replaceChildren(none);
    } else {
      classes.replaceChildren(...entries.map(([name, count]) => {
        const element = chip(name);
        const number = document.createElement("b");
        number.textContent = count;
        element.append(" ", number);
        return element;
      }));
    }
    const table = document.getElementById("recent-failures");
    table.hidden = !failures.recent.length;
    table.querySelector("tbody").replaceChildren(...failures.recent.map((failure) => {
      const row = document.createElement("tr");
      const link = document.createElement("a");
      link.href = `/campaigns/${id}/realizations/${failure.realization}`;
      link.textContent = `#${failure.realization}`;
      const first = cellText(row, link);
      const attempt = document.createElement("span");
      attempt.className = "muted small";
      attempt.textContent = ` try ${failure.attempt}`;
      first.appendChild(attempt);
      cellText(row, chip(failure.failure_class));
      cellText(row, failure.exit_code === null ? "–" : String(failure.exit_code));
      const line = document.createElement("code");
      line.className = "log-line";
      line.textContent = failure.last_line;
      cellText(row, line);
      return row;
    }));
  }

  let shownMap = data.latest_map ? data.latest_map.realization : null;

  function showMaps(latest) {
    if (!latest || latest.realization === shownMap) return;
    shownMap = latest.realization;
    const caption = document.getElementById("maps-caption");
    const link = document.createElement("a");
    link.id = "maps-realization";
    link.href = `/campaigns/${id}/realizations/${latest.realization}`;
    link.textContent = `#${latest.realization}`;
    caption.replaceChildren("I, Q and U of realisation ", link, ", the latest to succeed.");
    const figures = Object.keys(latest.images).sort().map((field) => {
      const figure = document.createElement("figure");
      const image = document.createElement("img");
      image.src = latest.images[field];
      image.alt = `${field} map of realisation ${latest.realization}`;
      image.dataset.field = field;
      image.width = 640;
      image.height = 397;
      image.loading = "lazy";
      figure.appendChild(image);
      return figure;
    });
    document.getElementById("maps").replaceChildren(...figures);
  }

  function showCampaignState(status) {
    MC.setBadge(document.querySelector("#campaign-state .badge"), status.state);
    const held = status.state === "held"; // fail fast: the cause says why; a retry releases it
    const unfinished = status.state === "queued" || status.state === "running" || held;
    document.getElementById("cancel-form").hidden = !unfinished;
    document.getElementById("retry-form").hidden = status.state === "cancelled" || !(status.counts.failed || held);
    const cause = document.getElementById("failure-cause");
    cause.hidden = !status.failure_cause;
    cause.textContent = status.failure_cause || "";
    const cancelled = document.getElementById("cancel-reason");
    cancelled.hidden = !status.cancel_reason;
    cancelled.textContent = status.cancel_reason ? "Cancelled: " + status.cancel_reason : "";
  }

  const refreshStatus = MC.debounce(async () => {
    let status;
    try {
      status = await MC.fetchJSON(`/ui/campaigns/${id}/status`);
    } catch (error) {
      return;
    }
    MC.showProgress(progressPanel, status);
    showCampaignState(status);
    showPlans(status.plans);
    showFailures(status.failures);
    showMaps(status.latest_map);
    if (!windowChosen && status.latest_window !== resultsWindow) {
      resultsWindow = status.latest_window;
      refreshResults();
    }
  }, 250);

  /* ------------------------------------------------------------------ timing and convergence charts */

  const windowSize = data.results_window_size;
  const windows = Math.max(1, Math.ceil(data.total / windowSize));
  let resultsWindow = data.results_window;
  let windowChosen = false; // once the user pages, stop following the newest results
  let results = null;
  const timingChart = document.getElementById("timing-chart");
  const convergenceChart = document.getElementById("convergence-chart");
  const stat = document.getElementById("timing-stat");

  function drawResults() {
    if (!results) return;
    const first = results.first, last = results.last;
    const slots = [];
    for (let i = first; i <= last; i++) slots.push(i);
    const which = stat.value;
    const items = results.items.filter((item) => item.timing).map((item) => {
      const parts = {};
      for (const key of TIMING_KEYS) parts[key.key] = (item.timing[key.key] || {})[which] || 0;
      const title = `#${item.index}: calc ${MC.format.duration(parts.calc)}, comm ${MC.format.duration(parts.comm)}, ` +
        `io ${MC.format.duration(parts.io)} (${which} over ranks); wall ${MC.format.duration(item.timing.total)}`;
      return { slot: item.index, parts: parts, title: title };
    });
    MC.charts.stackedBars(timingChart, {
      slots: slots, items: items, keys: TIMING_KEYS, yLabel: "seconds", xLabel: "realisation",
      label: `Timing split of realisations ${first} to ${last}`,
    });
    const newest = results.items.length ? results.items[results.items.length - 1].index : null;
    MC.charts.lines(convergenceChart, {
      logY: true, xInteger: true, xLabel: "PCG iteration", yLabel: "‖r‖ / ‖b‖",
      label: `Residual history of realisations ${first} to ${last}`,
      series: results.items.map((item) => ({
        label: String(item.index),
        y: item.residual_history,
        cls: item.index === newest ? "latest" : "",
        title: `#${item.index}: ${item.iterations} iteration${item.iterations === 1 ? "" : "s"}, ${item.converged ? "converged" : "not converged"}` +
          (item.strategy ? `, ${item.strategy}` : ""),
      })),
    });
    document.getElementById("window-label").textContent = `realisations ${first}–${last}`;
    document.getElementById("window-prev").disabled = resultsWindow <= 0;
    document.getElementById("window-next").disabled = resultsWindow >= windows - 1;
  }

  async function loadResults() {
    try {
      results = await MC.fetchJSON(`/ui/campaigns/${id}/results?window=${resultsWindow}`);
      drawResults();
    } catch (error) {
      /* keep the last drawing */
    }
  }
  const refreshResults = MC.debounce(loadResults, 400);

  stat.addEventListener("change", drawResults);
  document.getElementById("window-prev").addEventListener("click", () => {
    if (resultsWindow > 0) {
      resultsWindow -= 1;
      windowChosen = true;
      refreshResults();
    }
  });
  document.getElementById("window-next").addEventListener("click", () => {
    if (resultsWindow < windows - 1) {
      resultsWindow += 1;
      windowChosen = true;
      refreshResults();
    }
  });

  /* ------------------------------------------------------------------ realisation table rows */

  // The rows on this page of the table are re-read after events about them: state, attempts used and
  // the worker of the latest attempt (kept once the realisation ends), all from one small request.
  const tableRows = new Map();
  for (const row of document.querySelectorAll("table.realizations tr[data-index]")) {
    tableRows.set(Number(row.dataset.index), row);
  }
  const staleRows = new Set();

  function showRow(item) {
    const row = tableRows.get(item.index);
    if (!row) return;
    MC.setBadge(row.querySelector("[data-role=state]"), item.state);
    row.querySelector("[data-role=attempts]").textContent = `${item.attempts} / ${item.max_attempts}`;
    const worker = row.querySelector("[data-role=worker]");
    worker.textContent = item.worker || "–";
    worker.classList.toggle("muted", !!item.worker && !item.holding);
    worker.title = item.worker && !item.holding ? "the worker of the latest attempt" : "";
    row.querySelector("[data-role=finished]").textContent = MC.format.when(item.finished_at);
  }

  const refreshRows = MC.debounce(async () => {
    const wanted = staleRows.size ? [...staleRows] : [...tableRows.keys()];
    staleRows.clear();
    if (!wanted.length) return;
    try {
      const rows = await MC.fetchJSON(`/ui/campaigns/${id}/rows?indices=${wanted.join(",")}`);
      rows.forEach(showRow);
    } catch (error) {
      for (const index of wanted) staleRows.add(index); /* the next event tries again */
    }
  }, 300);

  function rowChanged(index) {
    if (index === null || index === undefined) {
      staleRows.clear(); /* a bulk change: every row */
      refreshRows();
    } else if (tableRows.has(index)) {
      staleRows.add(index);
      refreshRows();
    }
  }

  /* ------------------------------------------------------------------ products panel */

  // The panel's content comes from the providers registered on the server; a page opened before the
  // campaign had products builds it from /ui/.../products-panel when the first ones appear.
  const productsPanel = document.getElementById("products-panel");
  let productsShown = !document.getElementById("products-placeholder");

  function buildProductsPanel(panel) {
    const parts = [];
    const heading = productsPanel.querySelector("h2");
    if (panel.note) {
      const note = document.createElement("p");
      note.className = "small";
      note.textContent = panel.note;
      parts.push(note);
    }
    const maps = document.createElement("div");
    maps.className = "maps";
    for (const figure of panel.figures) {
      const element = document.createElement("figure");
      const image = document.createElement("img");
      image.src = figure.src;
      image.alt = figure.alt || figure.title;
      const caption = document.createElement("figcaption");
      caption.textContent = figure.title + (figure.caption ? " — " + figure.caption : "");
      element.append(image, caption);
      maps.appendChild(element);
    }
    parts.push(maps);
    for (const chart of panel.charts) {
      const element = document.createElement("figure");
      element.className = "chart-figure";
      const caption = document.createElement("figcaption");
      caption.textContent = chart.title;
      const box = document.createElement("div");
      box.className = "chart";
      box.dataset.chart = chart.kind;
      box.dataset.src = chart.src;
      box.dataset.empty = "No data yet.";
      element.append(caption, box);
      if (chart.caption) {
        const note = document.createElement("p");
        note.className = "muted small";
        note.textContent = chart.caption;
        element.appendChild(note);
      }
      parts.push(element);
    }
    productsPanel.replaceChildren(heading, ...parts);
  }

  // The aggregates are updated by the service just after it accepts a result, so the success event can
  // arrive before they exist: an empty answer is asked again a few times, a little later each time
  // (there is no event for the aggregates themselves).
  const PANEL_RETRIES = 6;
  let panelTries = 0;
  let panelTimer = null;

  async function loadProductsPanel() {
    panelTimer = null;
    if (!productsShown) {
      let panel;
      try {
        panel = await MC.fetchJSON(`/ui/campaigns/${id}/products-panel`);
      } catch (error) {
        panel = { empty: true };
      }
      if (panel.empty) {
        panelTries += 1;
        if (panelTries < PANEL_RETRIES) panelTimer = setTimeout(loadProductsPanel, 1000 * panelTries);
        return;
      }
      buildProductsPanel(panel);
      productsShown = true;
    }
    MC.charts.renderRegistered(productsPanel);
  }

  const refreshProducts = MC.debounce(() => {
    panelTries = 0;
    if (panelTimer !== null) clearTimeout(panelTimer);
    loadProductsPanel();
  }, 1500);

  /* ------------------------------------------------------------------ events */

  function onEvent(event) {
    if (event.kind === "plan") {
      if (event.data && event.data.scan_key === data.scan_key && event.data.ranks === data.ranks) refreshStatus();
      return;
    }
    if (event.campaign_id !== id) return;
    if (event.kind === "realization") {
      if (event.data && event.data.bulk) refreshGrid();
      else if (event.realization !== null && event.state) setCell(event.realization, event.state);
      rowChanged(event.data && event.data.bulk ? null : event.realization);
      if (event.state === "succeeded") {
        const index = event.realization;
        if (index === null || Math.floor(index / windowSize) === resultsWindow) refreshResults();
        refreshProducts();
      }
    }
    if (event.kind === "campaign" && event.state === "deleted") {
      window.location.assign("/");
      return;
    }
    refreshStatus();
  }

  MC.listen({ after: data.after_event }, {
    event: onEvent,
    resync: () => {
      refreshGrid();
      refreshStatus();
      refreshResults();
      rowChanged(null);
      refreshProducts();
    },
  });
  loadResults();
  if (productsShown) MC.charts.renderRegistered(productsPanel);
})();
