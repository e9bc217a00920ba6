/* A realisation's page: its timing split and convergence curve, and a notice when it changes. */
"use strict";

(function () {
  const MC = window.MapCampaign;
  const data = MC.pageData();

  const timing = document.getElementById("result-timing");
  if (timing && data.timing) {
    const keys = [
      { key: "calc", label: "calc", cls: "bar-calc" },
      { key: "comm", label: "comm", cls: "bar-comm" },
      { key: "io", label: "io", cls: "bar-io" },
    ];
    const items = ["mean", "max"].map((which, i) => {
      const parts = {};
      for (const key of keys) parts[key.key] = (data.timing[key.key] || {})[which] || 0;
      return { slot: i, parts: parts, title: `${which} over ranks: calc ${MC.format.duration(parts.calc)}, ` +
        `comm ${MC.format.duration(parts.comm)}, io ${MC.format.duration(parts.io)}` };
    });
    MC.charts.stackedBars(timing, {
      slots: [0, 1], items: items, keys: keys, yLabel: "seconds", xLabel: "0: mean over ranks, 1: max over ranks",
      width: 520, height: 230,
      label: "Timing split of this realisation",
    });
  }
  const convergence = document.getElementById("result-convergence");
  if (convergence) {
    MC.charts.lines(convergence, {
      logY: true, xInteger: true, xLabel: "PCG iteration", yLabel: "‖r‖ / ‖b‖", label: "Residual history", width: 520, height: 230,
      series: [{ label: String(data.index), y: data.residual_history || [], cls: "latest", title: `realisation ${data.index}` }],
    });
  }

  MC.listen({ campaign_id: data.campaign_id, after: data.after_event }, {
    event: (event) => {
      const mine = event.realization === data.index || (event.data && event.data.bulk);
      if (event.kind === "realization" && mine) document.getElementById("changed").hidden = false;
    },
  });
  document.getElementById("reload-link").addEventListener("click", (event) => {
    event.preventDefault();
    window.location.reload();
  });
})();
