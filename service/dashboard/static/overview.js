/* The overview: each listed campaign's state, bar, throughput and ETA follow the event stream. */
"use strict";

(function () {
  const MC = window.MapCampaign;
  const data = MC.pageData();
  const shown = new Set(data.campaign_ids || []);

  const refresh = MC.debounce(async () => {
    if (!shown.size) return;
    let statuses;
    try {
      statuses = await MC.fetchJSON("/ui/overview?ids=" + Array.from(shown).join(","));
    } catch (error) {
      return;
    }
    for (const status of statuses) {
      const row = document.querySelector(`tr[data-campaign="${status.id}"]`);
      if (!row) continue;
      MC.showProgress(row, status);
      MC.setBadge(row.querySelector("[data-role=state]"), status.state);
    }
  }, 500);

  MC.listen({ after: data.after_event }, {
    event: (event) => {
      if (event.campaign_id === null || event.campaign_id === undefined) return;
      if (shown.has(event.campaign_id)) refresh();
      else if (event.kind === "campaign" && event.state === "queued" && event.data && "realizations" in event.data) {
        // a new campaign (its creation event carries its size; a retried one's does not)
        document.getElementById("new-campaigns").hidden = false;
      }
    },
    resync: refresh,
  });
})();
