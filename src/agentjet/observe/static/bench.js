"use strict";
// Bench page: the `ajet bench` history, one chart per metric (x: run, oldest first), and the table.
(() => {
  const { el, api, nav, fmt, Chart } = AJ;
  nav("bench");
  const main = document.getElementById("main");
  main.append(el("h1", { text: "Bench history" }));
  (async () => {
    const data = await api("/dashboard/api/bench");
    document.getElementById("live").textContent = "loaded " + new Date().toLocaleTimeString();
    if (!data.records.length) { main.append(el("p", { class: "muted", text: data.message || `no runs in ${data.history}` })); return; }
    const recs = data.records;
    main.append(el("p", { class: "muted", text: `${recs.length} runs from ${data.history}` }));
    const grid = el("div", { class: "grid" });
    main.append(grid);
    const names = [...new Set(recs.flatMap((r) => Object.keys(r.metrics)))].sort();
    const xs = recs.map((_, i) => i);
    for (const n of names) {
      const unit = (recs.find((r) => n in r.metrics) || { metrics: {} }).metrics[n].unit;
      const c = new Chart(grid, n + (unit ? ` (${unit})` : ""), { xLabel: "run", height: 170 });
      const series = {};
      for (const mode of ["quick", "full"]) {
        const ys = recs.map((r) => (r.mode === mode && n in r.metrics ? r.metrics[n].value : null));
        if (ys.some((y) => y !== null)) series[mode] = ys;
      }
      c.set(xs, series);
    }
    const head = el("tr", {}, el("th", { text: "#" }), el("th", { text: "commit" }), el("th", { text: "date" }),
      el("th", { text: "machine" }), el("th", { text: "mode" }), ...names.map((n) => el("th", { class: "num", text: n })));
    const rows = recs.map((r, i) => el("tr", {}, el("td", { text: i }), el("td", { class: "mono", text: r.commit.slice(0, 10) }),
      el("td", { text: r.date }), el("td", { text: r.machine }), el("td", { text: r.mode }),
      ...names.map((n) => el("td", { class: "num", text: n in r.metrics ? fmt(r.metrics[n].value) : "" }))));
    main.append(el("h2", { text: "Runs" }), el("div", { style: "overflow-x:auto" }, el("table", {}, head, ...rows.reverse())));
  })().catch((e) => main.append(el("p", { class: "error", text: e.message })));
})();
