/* Shared by every page: page data, JSON reads, formatting, confirmations, and the live event stream.
 *
 * Live updates: the page opens an EventSource on /ui/events (the service's event stream, authenticated
 * by the session cookie) starting after the last event id the server read before rendering the page,
 * so nothing that happened in between is missed. The browser reconnects by itself and resumes with
 * Last-Event-ID; after a reconnection the page re-reads its state in full, in case.
 */
"use strict";

(function () {
  const root = (window.MapCampaign = window.MapCampaign || {});

  function pageData() {
    const element = document.getElementById("page-data");
    try {
      return element ? JSON.parse(element.textContent) : {};
    } catch (error) {
      return {};
    }
  }

  async function fetchJSON(url) {
    const answer = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (answer.status === 401) {
      window.location.assign("/login?next=" + encodeURIComponent(window.location.pathname));
      throw new Error("session ended");
    }
    if (!answer.ok) throw new Error(`${url}: ${answer.status}`);
    return answer.json();
  }

  /* Run fn at most once per `ms`, after the last call (a burst of events makes one refresh). */
  function debounce(fn, ms) {
    let timer = null;
    return function () {
      if (timer !== null) clearTimeout(timer);
      timer = setTimeout(() => {
        timer = null;
        fn();
      }, ms);
    };
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
    if (seconds < 1) return seconds.toFixed(2) + " s";
    if (seconds < 90) return (seconds >= 10 ? seconds.toFixed(0) : seconds.toFixed(1)) + " s";
    if (seconds < 5400) return (seconds / 60).toFixed(0) + " min";
    if (seconds < 172800) return (seconds / 3600).toFixed(1) + " h";
    return (seconds / 86400).toFixed(1) + " d";
  }

  function rate(perHour) {
    return perHour === null || perHour === undefined ? "–" : perHour.toFixed(1) + " / h";
  }

  /* As the pages' "when" filter: 2026-11-25 15:30:00 UTC. */
  function when(iso) {
    if (!iso) return "–";
    return new Date(iso).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }

  function ago(iso) {
    if (!iso) return "never";
    return duration(Math.max((Date.now() - Date.parse(iso)) / 1000, 0)) + " ago";
  }

  function setText(scope, selector, value) {
    for (const element of scope.querySelectorAll(selector)) element.textContent = value;
  }

  /* A state badge made by the templates: change its text and colour class. */
  function setBadge(badge, state) {
    if (!badge) return;
    badge.className = "badge s-" + state;
    badge.textContent = state;
  }

  /* Counts, bar, throughput and ETA of one campaign (overview row or campaign page). */
  function showProgress(scope, status) {
    const counts = status.counts;
    const bar = scope.querySelector("[data-role=progress]");
    if (bar) root.charts.progress(bar, counts, status.total);
    setText(scope, "[data-count=succeeded]", counts.succeeded);
    setText(scope, "[data-count=running]", counts.running + counts.claimed);
    setText(scope, "[data-count=failed]", counts.failed);
    setText(scope, "[data-count=queued]", counts.queued);
    setText(scope, "[data-count=cancelled]", counts.cancelled);
    setText(scope, "[data-role=throughput]", rate(status.throughput_per_hour));
    setText(scope, "[data-role=eta]", duration(status.eta_seconds));
  }

  /* Forms with data-confirm ask first (no inline handlers: the page's policy forbids them). */
  function confirmForms() {
    for (const form of document.querySelectorAll("form[data-confirm]")) {
      form.addEventListener("submit", (event) => {
        if (!window.confirm(form.dataset.confirm)) event.preventDefault();
      });
    }
  }

  function showLiveState(state) {
    const badge = document.getElementById("live-status");
    if (!badge) return;
    badge.hidden = false;
    badge.dataset.state = state;
    badge.textContent = { live: "live", reconnecting: "connecting…", off: "offline" }[state] || state;
  }

  /* Listen to the event stream. handlers.event(event) for each event; handlers.resync() after a reconnection. */
  function listen(params, handlers) {
    if (!window.EventSource) return null;
    const query = new URLSearchParams();
    for (const [key, value] of Object.entries(params || {})) {
      if (value !== undefined && value !== null) query.set(key, String(value));
    }
    const source = new EventSource("/ui/events?" + query.toString());
    let dropped = false;
    showLiveState("reconnecting");
    source.addEventListener("open", () => {
      showLiveState("live");
      if (dropped && handlers.resync) handlers.resync();
      dropped = false;
    });
    source.addEventListener("error", () => {
      dropped = true;
      showLiveState(source.readyState === EventSource.CLOSED ? "off" : "reconnecting");
    });
    const receive = (message) => {
      let event;
      try {
        event = JSON.parse(message.data);
      } catch (error) {
        return;
      }
      root.lastEventId = event.id;
      handlers.event(event);
    };
    for (const kind of ["campaign", "realization", "plan", "worker", "lease_expired", "message"]) {
      source.addEventListener(kind, receive);
    }
    window.addEventListener("pagehide", () => source.close());
    return source;
  }

  root.pageData = pageData;
  root.fetchJSON = fetchJSON;
  root.debounce = debounce;
  root.format = { duration, rate, ago, when };
  root.setText = setText;
  root.setBadge = setBadge;
  root.showProgress = showProgress;
  root.listen = listen;

  document.addEventListener("DOMContentLoaded", confirmForms);
})();
