"use strict";
// Bench page: the `ajet bench` history. Learning curves of the chosen versions overlaid, one colour per version
// (held-out eval vs train steps and vs training minutes, per task), then one chart per metric (x: run, oldest
// first), and the table.
(() => {
  const { el, api, nav, fmt, Chart, COLORS } = AJ;
  nav("bench");
  const main = document.getElementById("main");
  main.append(el("h1", { text: "Bench history" }));

  // Versions (commits) with learning curves, in the order they first appear in the history.
  function versions(recs) {
    const seen = [];
    for (const r of recs) if (r.curves && Object.keys(r.curves).length && !seen.includes(r.commit)) seen.push(r.commit);
    return seen;
  }

  // One chart per task and axis: a series per run, coloured by its version; x is the union of the runs' x values.
  function overlay(grid, recs, chosen, colour) {
    grid.textContent = "";
    const tasks = [...new Set(recs.flatMap((r) => Object.keys(r.curves || {})))].sort();
    for (const task of tasks) {
      const runs = recs.filter((r) => chosen.has(r.commit) && r.curves && r.curves[task]);
      for (const [axis, title, xLabel] of [["steps", "held-out eval vs train steps", "train steps"],
        ["train_minutes", "held-out eval vs training minutes", "training minutes"]]) {
        const c = new Chart(grid, `${task}: ${title}`, { xLabel, height: 260 });
        const curves = runs.map((r) => {
          const pts = r.curves[task].points;
          // the first demos recorded no training clock: their wall minutes stand in (said in the label)
          const wall = axis === "train_minutes" && pts.some((p) => p.train_minutes === null);
          const key = wall ? "minutes" : axis;
          const seed = r.settings && r.settings.bench ? r.settings.bench.seed : r.settings && r.settings.seed;
          const name = `${r.commit.slice(0, 7)}${seed !== undefined ? " s" + seed : ""}${r.backfilled ? " (backfilled)" : ""}` +
            `${wall ? " (wall min)" : ""} ${r.date}`;
          return { name, commit: r.commit, pts: pts.filter((p) => p[key] !== null).map((p) => [p[key], p.reward]) };
        });
        const xs = [...new Set(curves.flatMap((cv) => cv.pts.map((p) => p[0])))].sort((a, b) => a - b);
        const series = {}, colors = {};
        for (const cv of curves) {
          const at = new Map(cv.pts.map((p) => [p[0], p[1]]));  // a later eval at the same x wins
          series[cv.name] = xs.map((x) => (at.has(x) ? at.get(x) : null));
          colors[cv.name] = colour[cv.commit];
        }
        c.set(xs, series, colors);
        c.box.dataset.versions = String(new Set(curves.map((cv) => cv.commit)).size);
      }
    }
  }

  (async () => {
    const data = await api("/dashboard/api/bench");
    document.getElementById("live").textContent = "loaded " + new Date().toLocaleTimeString();
    if (!data.records.length) { main.append(el("p", { class: "muted", text: data.message || `no runs in ${data.history}` })); return; }
    const recs = data.records;
    main.append(el("p", { class: "muted", text: `${recs.length} runs from ${data.history}` }));

    const vs = versions(recs);
    if (vs.length) {
      const colour = Object.fromEntries(vs.map((v, i) => [v, COLORS[i % COLORS.length]]));
      const chosen = new Set(vs);
      const grid = el("div", { class: "grid", id: "learning" });
      const picks = vs.map((v) => {
        const first = recs.find((r) => r.commit === v);
        const box = el("input", { type: "checkbox", "data-commit": v });
        box.checked = true;
        box.addEventListener("change", () => { box.checked ? chosen.add(v) : chosen.delete(v); overlay(grid, recs, chosen, colour); });
        const swatch = el("span", { class: "swatch", text: "■ " });
        swatch.style.color = colour[v];
        return el("label", { class: "version" }, box, swatch,
          el("span", { class: "mono", text: v.slice(0, 10) }), el("span", { class: "muted", text: ` ${first.date}${first.backfilled ? " (backfilled)" : ""}  ` }));
      });
      main.append(el("h2", { text: "Learning curves, one colour per version" }), el("div", { id: "versions" }, ...picks), grid);
      overlay(grid, recs, chosen, colour);
    }

    main.append(el("h2", { text: "Every metric over the runs" }));
    const grid = el("div", { class: "grid" });
    main.append(grid);
    const names = [...new Set(recs.flatMap((r) => Object.keys(r.metrics)))].sort();
    const xs = recs.map((_, i) => i);
    for (const n of names) {
      const unit = (recs.find((r) => n in r.metrics) || { metrics: {} }).metrics[n].unit;
      const c = new Chart(grid, n + (unit ? ` (${unit})` : ""), { xLabel: "run", height: 170 });
      const series = {};
      for (const mode of ["quick", "full", "learn"]) {
        const ys = recs.map((r) => (r.mode === mode && n in r.metrics ? r.metrics[n].value : null));
        if (ys.some((y) => y !== null)) series[mode] = ys;
      }
      c.set(xs, series);
    }
    const head = el("tr", {}, el("th", { text: "#" }), el("th", { text: "commit" }), el("th", { text: "date" }),
      el("th", { text: "machine" }), el("th", { text: "mode" }), ...names.map((n) => el("th", { class: "num", text: n })));
    const rows = recs.map((r, i) => el("tr", {}, el("td", { text: i }), el("td", { class: "mono", text: r.commit.slice(0, 10) }),
      el("td", { text: r.date }), el("td", { text: r.machine }), el("td", { text: r.mode + (r.backfilled ? " (backfilled)" : "") }),
      ...names.map((n) => el("td", { class: "num", text: n in r.metrics ? fmt(r.metrics[n].value) : "" }))));
    main.append(el("h2", { text: "Runs" }), el("div", { style: "overflow-x:auto" }, el("table", {}, head, ...rows.reverse())));
  })().catch((e) => main.append(el("p", { class: "error", text: e.message })));
})();
