"use strict";
// Shared helpers of the dashboard pages. No token is ever kept here: the session is an HttpOnly cookie.
const AJ = (() => {
  const PAGES = [["run", "Run"], ["clients", "Clients"], ["episodes", "Episodes"], ["trace", "Trace"], ["bench", "Bench"]];
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777", "#4b5563", "#65a30d"];

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = v;
      else if (k === "class") node.className = v;
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
    return node;
  }

  function loginUrl() {
    return "/dashboard/login?next=" + encodeURIComponent(location.pathname + location.search);
  }

  async function api(path) {
    const r = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (r.status === 401) { location.href = loginUrl(); throw new Error("not logged in"); }
    if (!r.ok) {
      let msg = r.statusText;
      try { msg = (await r.json()).error.message; } catch (e) { /* not JSON */ }
      throw new Error(msg);
    }
    return r.json();
  }

  function status(text, bad) {
    const s = document.getElementById("live");
    if (s) { s.textContent = text; s.style.color = bad ? "#f87171" : ""; }
  }

  // Poll fn every ms while the tab is visible (live updates without holding a connection open).
  function poll(fn, ms) {
    const tick = async () => {
      if (!document.hidden) {
        try { await fn(); status("updated " + new Date().toLocaleTimeString()); } catch (e) { status("error: " + e.message, true); }
      }
      setTimeout(tick, ms);
    };
    tick();
  }

  function nav(active) {
    const links = PAGES.map(([p, label]) => el("a", { href: "/dashboard/" + p, class: p === active ? "active" : null, text: label }));
    const logout = el("form", { method: "post", action: "/dashboard/logout" }, el("button", { type: "submit", text: "log out" }));
    const header = el("header", {}, el("span", { class: "brand", text: "AgentJet" }), el("nav", {}, ...links),
      el("span", { class: "spacer" }), el("span", { id: "live", text: "connecting..." }), logout);
    document.body.prepend(header);
  }

  function fmt(x, digits = 3) {
    if (x === null || x === undefined || Number.isNaN(x)) return "–";
    if (typeof x !== "number") return String(x);
    if (Number.isInteger(x)) return x.toLocaleString();
    const a = Math.abs(x);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return x.toExponential(2);
    return x.toFixed(digits);
  }

  function ago(unix) {
    if (!unix) return "–";
    const s = Math.max(0, Date.now() / 1000 - unix);
    if (s < 60) return s.toFixed(0) + " s ago";
    if (s < 3600) return (s / 60).toFixed(0) + " min ago";
    return (s / 3600).toFixed(1) + " h ago";
  }

  // A line chart (uPlot) over a shared x axis; series = {name: [y per x]}. The container carries
  // data-points (the number of plotted values) so that a reader can tell an empty chart from a full one.
  class Chart {
    constructor(parent, title, opts = {}) {
      this.opts = opts;
      this.box = el("div", { class: "card chart", "data-title": title, "data-points": "0" }, el("h3", { text: title }));
      this.body = el("div", {}, el("div", { class: "empty", text: "no data yet" }));
      this.box.append(this.body);
      parent.append(this.box);
      this.plot = null;
      this.key = "";
    }
    // series: {name: ys aligned with xs}; colors (optional): {name: stroke} (else the palette by name order)
    set(xs, series, colors) {
      const names = Object.keys(series).sort();
      const points = names.reduce((n, k) => n + series[k].filter((v) => v !== null && v !== undefined).length, 0);
      this.box.dataset.points = String(points);
      if (!xs.length || !names.length) return;
      const data = [xs, ...names.map((k) => series[k])];
      const key = names.join("|");
      if (this.plot && key === this.key) { this.plot.setData(data); return; }
      if (this.plot) this.plot.destroy();
      this.body.textContent = "";
      this.key = key;
      const width = Math.max(300, this.box.clientWidth - 20);
      this.plot = new uPlot({
        width, height: this.opts.height || 200,
        scales: { x: { time: false } },
        axes: [{ label: this.opts.xLabel || "step", size: 34, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000] },
          { size: 56, values: (u, vals) => vals.map((v) => fmt(v, 2)) }],
        series: [{ label: this.opts.xLabel || "step" }, ...names.map((k, i) => ({
          label: k, stroke: (colors && colors[k]) || COLORS[i % COLORS.length], width: 1.5, spanGaps: true,
          points: { show: true, size: 4 } }))],
        legend: { live: true },
      }, data, this.body);
    }
  }

  // Bars for a histogram {label: count}.
  function bars(parent, title) {
    const box = el("div", { class: "card", "data-title": title, "data-points": "0" }, el("h3", { text: title }));
    const area = el("div", {}, el("div", { class: "empty", text: "no data yet" }));
    box.append(area);
    parent.append(box);
    return (counts) => {
      const keys = Object.keys(counts).sort((a, b) => Number(a) - Number(b));
      box.dataset.points = String(keys.length);
      if (!keys.length) return;
      const max = Math.max(...keys.map((k) => counts[k]));
      const row = el("div", { class: "bars" }, ...keys.map((k) => {
        const b = el("div", { class: "bar", title: `${k}: ${counts[k]}` }, el("span", { text: fmt(counts[k], 0) }));
        b.style.height = (100 * counts[k] / max).toFixed(1) + "%";
        return b;
      }));
      area.replaceChildren(row, el("div", { class: "bars-x" }, ...keys.map((k) => el("div", { text: k }))));
    };
  }

  return { el, api, poll, nav, fmt, ago, Chart, bars, COLORS };
})();
