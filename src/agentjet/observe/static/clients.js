"use strict";
// Clients page: every client seen, when, and how its episodes ended.
(() => {
  const { el, api, poll, nav, ago } = AJ;
  nav("clients");
  const main = document.getElementById("main");
  const table = el("table", { id: "clients" });
  main.append(el("h1", { text: "Clients" }), table);
  const cols = [["client", null], ["last seen", null], ["open", "num"], ["stored", "num"], ["trained", "num"],
    ["expired", "num"], ["aborted", "num"]];
  poll(async () => {
    const { clients } = await api("/dashboard/api/clients");
    const head = el("tr", {}, ...cols.map(([c, cls]) => el("th", { class: cls, text: c })));
    const rows = clients.map((c) => el("tr", {},
      el("td", {}, el("a", { href: "/dashboard/episodes?client_id=" + encodeURIComponent(c.client_id), text: c.client_id })),
      el("td", { text: ago(c.last_seen) }), el("td", { class: "num", text: c.open_episodes }),
      el("td", { class: "num", text: c.stored_episodes }), el("td", { class: "num", text: c.trained_episodes }),
      el("td", { class: "num", text: c.expired }), el("td", { class: "num", text: c.aborted })));
    table.replaceChildren(head, ...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 7, class: "muted", text: "no client yet" }))]));
  }, 3000);
})();
