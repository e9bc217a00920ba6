/* The workers page: heartbeat ages tick every second; the table is re-read every few seconds. */
"use strict";

(function () {
  const MC = window.MapCampaign;
  const body = document.querySelector("#workers tbody");

  function tick() {
    for (const cell of body.querySelectorAll("[data-role=heartbeat]")) {
      cell.textContent = MC.format.ago(cell.dataset.at);
    }
  }

  function row(worker) {
    const tr = document.createElement("tr");
    tr.dataset.worker = worker.id;
    const cell = (role, value) => {
      const td = document.createElement("td");
      td.dataset.role = role;
      td.textContent = value;
      tr.appendChild(td);
      return td;
    };
    cell("name", worker.name);
    cell("site", worker.site);
    cell("host", worker.host);
    cell("heartbeat", MC.format.ago(worker.last_heartbeat_at)).dataset.at = worker.last_heartbeat_at || "";
    const running = cell("running", `${worker.running} / ${worker.capacity}`);
    if (worker.building) {
      const builds = document.createElement("span");
      builds.className = "muted small";
      builds.textContent = ` + ${worker.building} plan build${worker.building > 1 ? "s" : ""}`;
      running.appendChild(builds);
    }
    const own = cell("own", worker.own_tasks.length ? "" : "–");
    own.className = "small";
    for (const group of worker.own_tasks) {
      const line = document.createElement("div");
      const campaign = document.createElement("a");
      campaign.href = `/campaigns/${group.campaign_id}`;
      campaign.textContent = group.campaign;
      line.append(campaign, ": ");
      group.realizations.forEach((index, i) => {
        const link = document.createElement("a");
        link.href = `/campaigns/${group.campaign_id}/realizations/${index}`;
        link.textContent = `#${index}`;
        line.append(...(i ? [", ", link] : [link]));
      });
      own.appendChild(line);
    }
    return tr;
  }

  async function refresh() {
    try {
      const workers = await MC.fetchJSON("/ui/workers");
      if (workers.length) body.replaceChildren(...workers.map(row));
    } catch (error) {
      /* try again at the next tick */
    }
  }

  setInterval(tick, 1000);
  setInterval(refresh, 5000);
  MC.listen({}, { event: (event) => event.kind === "worker" && refresh(), resync: refresh });
})();
