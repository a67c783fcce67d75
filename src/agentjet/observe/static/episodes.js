"use strict";
// Episodes page: a filtered list (task type, reward, version, status, eval, client); stored ones link to their trace.
(() => {
  const { el, api, poll, nav, fmt, ago } = AJ;
  nav("episodes");
  const main = document.getElementById("main");
  const q = new URLSearchParams(location.search);
  const input = (name, label, type = "text", width = "8em") => {
    const i = el("input", { name, type, value: q.get(name) || "", step: type === "number" ? "any" : null });
    i.style.width = width;
    return el("label", {}, label, i);
  };
  const select = (name, label, options) => el("label", {}, label, el("select", { name }, ...options.map(([v, t]) =>
    el("option", { value: v, selected: (q.get(name) || "") === v, text: t }))));
  const form = el("form", { class: "filters", method: "get", action: "/dashboard/episodes" },
    input("task_type", "task type"),
    select("status", "status", [["", "any"], ["open", "open"], ["pending", "pending"], ["trained", "trained"], ["eval", "eval"],
      ["dropped", "dropped (stale / uniform)"], ["failed", "failed (expired / aborted)"], ["expired", "expired"], ["aborted", "aborted"]]),
    input("min_reward", "min reward", "number", "6em"), input("max_reward", "max reward", "number", "6em"),
    input("version", "begin version", "number", "6em"),
    select("eval", "eval", [["", "any"], ["true", "eval only"], ["false", "training only"]]),
    input("client_id", "client"), input("limit", "limit", "number", "5em"),
    el("button", { type: "submit", text: "filter" }));
  const table = el("table", { id: "episodes" });
  main.append(el("h1", { text: "Episodes" }), form, table);

  const params = new URLSearchParams();
  for (const [k, v] of q.entries()) if (v !== "") params.set(k, v);
  const cols = ["episode", "client", "task", "type", "status", "reward", "begin v", "step", "calls", "samples", "ended"];
  poll(async () => {
    const { episodes } = await api("/dashboard/api/episodes?" + params.toString());
    const head = el("tr", {}, ...cols.map((c) => el("th", { text: c })));
    const rows = episodes.map((e) => {
      const stored = !["open", "expired", "aborted"].includes(e.status) || e.samples > 0;
      const id = stored ? el("a", { href: "/dashboard/trace?episode=" + encodeURIComponent(e.episode_id), text: e.episode_id.slice(0, 15) })
        : el("span", { class: "mono", text: e.episode_id.slice(0, 15) });
      const reward = e.reward === null ? "–" : (typeof e.reward === "object" ? JSON.stringify(e.reward) : fmt(e.reward));
      return el("tr", { "data-status": e.status }, el("td", { class: "mono" }, id), el("td", { text: e.client_id }),
        el("td", { text: e.task_id }), el("td", { text: e.task_type }),
        el("td", { text: e.status + (e.eval && e.status !== "eval" ? " (eval)" : "") + (e.team_id ? " · team" : "") }),
        el("td", { class: "num", text: reward }), el("td", { class: "num", text: e.begin_policy_version }),
        el("td", { class: "num", text: e.consumed_step ?? "–" }), el("td", { class: "num", text: e.calls }),
        el("td", { class: "num", text: e.samples }), el("td", { text: e.ended_at ? ago(e.ended_at) : "–" }));
    });
    table.replaceChildren(head, ...(rows.length ? rows : [el("tr", {}, el("td", { colspan: cols.length, class: "muted", text: "no episode matches" }))]));
  }, 4000);
})();
