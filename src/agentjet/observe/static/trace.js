"use strict";
// Trace viewer: one stored episode. Every call with its messages, then each training sample token by token,
// coloured by loss mask, advantage, behaviour logprob, trainer logprob or their difference. Hover shows the
// token id, its text, the policy version that generated it and the logprobs. Merge boundaries (where each
// call's generation starts), version changes inside a reply (a weight update landed while it was generated) and
// drift repairs are marked.
(() => {
  const { el, api, nav, fmt } = AJ;
  nav("trace");
  const main = document.getElementById("main");
  const q = new URLSearchParams(location.search);
  const tip = el("div", { id: "tip" });
  document.body.append(tip);

  const MODES = [["mask", "loss mask"], ["advantage", "advantage"], ["behaviour", "behaviour logprob"],
    ["trainer", "trainer logprob"], ["diff", "trainer − behaviour"]];
  let mode = q.get("color") || "mask";

  const mix = (a, b, t) => a.map((x, i) => Math.round(x + (b[i] - x) * Math.max(0, Math.min(1, t))));
  const rgb = (c, alpha = 1) => `rgba(${c[0]},${c[1]},${c[2]},${alpha})`;
  const PROMPT = "rgba(229,231,235,0.55)";
  function color(s, i) {
    const trained = s.loss_mask[i] === 1;
    if (mode === "mask") return trained ? "rgba(59,130,246,0.38)" : "rgba(250,204,21,0.28)";
    if (!trained) return PROMPT;
    const adv = s.trainer ? s.trainer.advantage : null;
    const tlp = s.trainer && s.trainer.logprobs ? s.trainer.logprobs[i] : null;
    if (mode === "advantage") {
      if (adv === null) return "rgba(156,163,175,0.4)";
      return adv >= 0 ? rgb([22, 163, 74], 0.15 + 0.6 * Math.min(1, adv / 2)) : rgb([220, 38, 38], 0.15 + 0.6 * Math.min(1, -adv / 2));
    }
    const lp = mode === "behaviour" ? s.logprobs[i] : tlp;
    if (mode === "diff") {
      if (tlp === null || tlp === undefined) return "rgba(156,163,175,0.4)";
      return rgb([147, 51, 234], 0.08 + 0.8 * Math.min(1, Math.abs(tlp - s.logprobs[i]) / 0.5));
    }
    if (lp === null || lp === undefined) return "rgba(156,163,175,0.4)";
    return rgb(mix([220, 38, 38], [22, 163, 74], Math.exp(lp)), 0.45);  // probability: red (low) to green (high)
  }

  function legend() {
    const sw = (c, label) => el("span", {}, Object.assign(el("span", { class: "sw" }), { style: `background:${c}` }), label);
    const items = {
      mask: [sw("rgba(59,130,246,0.38)", "trained (loss mask 1)"), sw("rgba(250,204,21,0.28)", "masked (prompt, tool output, user)")],
      advantage: [sw(rgb([22, 163, 74], 0.6), "positive advantage"), sw(rgb([220, 38, 38], 0.6), "negative"), sw(PROMPT, "not trained")],
      behaviour: [sw(rgb([22, 163, 74], 0.45), "p≈1"), sw(rgb([220, 38, 38], 0.45), "p≈0 (behaviour policy)"), sw(PROMPT, "not trained")],
      trainer: [sw(rgb([22, 163, 74], 0.45), "p≈1"), sw(rgb([220, 38, 38], 0.45), "p≈0 (trainer)"), sw("rgba(156,163,175,0.4)", "no trainer record")],
      diff: [sw(rgb([147, 51, 234], 0.88), "|trainer − behaviour| ≥ 0.5"), sw(rgb([147, 51, 234], 0.08), "≈ 0")],
    }[mode];
    return el("div", { class: "legend" }, ...items,
      el("span", {}, el("span", { class: "boundary", text: "▸ call" }), "merge boundary (a call's generation starts)"),
      el("span", {}, el("span", { class: "boundary version", text: "v1→v2" }), " policy version changed inside a reply (a weight update landed)"),
      el("span", {}, el("span", { class: "tok drift", text: "drift" }), " drift region (repaired re-tokenization)"));
  }

  function messageText(s, m) { return s.pieces.slice(m.start, m.end).join(""); }

  function callsView(s) {
    const box = el("div", { class: "calls" });
    let prevEnd = 0;
    for (const c of s.calls) {
      const [gs, ge] = c.generated;
      const msgs = (s.messages || []).filter((m) => m.start >= prevEnd && m.end <= gs);
      const vs = [...new Set((s.versions || []).slice(gs, ge).filter((v) => v !== null))];
      const flags = [el("span", { class: "flag", text: vs.length > 1 ? vs.map((v) => `v${v}`).join("→") : `v${c.policy_version}` }),
        el("span", { class: "flag", text: c.finish_reason || "" }),
        el("span", { class: "flag api", title: "the API this call came through", text: c.api || "chat.completions" })];
      if (c.prompt_repaired) flags.push(el("span", { class: "flag warn", text: "prompt repaired (drift)" }));
      if (!c.exact_context) flags.push(el("span", { class: "flag warn", text: "context differs from its prompt" }));
      const lines = msgs.length ? msgs.map((m) => el("div", { class: "msg" }, el("span", { class: "role", text: m.role }), messageText(s, m)))
        : [el("div", { class: "msg" }, el("span", { class: "role", text: "prompt" }), s.pieces.slice(prevEnd, gs).join(""))];
      box.append(el("div", { class: "call", "data-call": c.call_index },
        el("div", {}, el("b", { text: `call ${c.call_index}` }), ...flags),
        ...lines,
        el("div", { class: "msg gen" }, el("span", { class: "role", text: "generated" }), s.pieces.slice(gs, ge).join(""))));
      prevEnd = ge;
    }
    return box;
  }

  function tokensView(s, si) {
    const box = el("div", { class: "tokens", "data-sample": si });
    const starts = new Map(s.calls.map((c) => [c.generated[0], c.call_index]));
    const drift = new Array(s.token_ids.length).fill(null);
    for (const r of s.drift_regions || []) for (let i = r.start; i < r.end && i < drift.length; i++) drift[i] = r;
    const driftStarts = new Set((s.drift_regions || []).map((r) => r.start));
    const changes = new Map((s.version_changes || []).map((c) => [c.index, c]));
    let trained = 0;
    const frag = document.createDocumentFragment();
    for (let i = 0; i < s.token_ids.length; i++) {
      if (starts.has(i)) frag.append(el("span", { class: "boundary", "data-boundary": starts.get(i), text: `▸ call ${starts.get(i)}` }));
      if (driftStarts.has(i)) frag.append(el("span", { class: "boundary drift", text: "drift" }));
      if (changes.has(i)) {
        const c = changes.get(i);
        frag.append(el("span", { class: "boundary version", "data-version-change": i, text: `v${c.from}→v${c.to}` }));
      }
      const t = el("span", { class: "tok" + (s.loss_mask[i] ? " t" : " p") + (drift[i] ? " drift" : ""), "data-i": i });
      t.textContent = s.pieces[i];
      t.style.backgroundColor = color(s, i);
      trained += s.loss_mask[i];
      frag.append(t);
    }
    box.append(frag);
    box.dataset.tokens = String(s.token_ids.length);
    box.dataset.trained = String(trained);
    box.dataset.boundaries = String(starts.size);
    box.dataset.versionChanges = String(changes.size);
    box.addEventListener("mousemove", (ev) => {
      const t = ev.target.closest(".tok");
      if (!t) { tip.style.display = "none"; return; }
      const i = Number(t.dataset.i);
      const tlp = s.trainer && s.trainer.logprobs ? s.trainer.logprobs[i] : null;
      const lines = [`position ${i}   token id ${s.token_ids[i]}`, `text ${JSON.stringify(s.pieces[i])}`,
        s.loss_mask[i] ? `trained (call ${s.token_call[i]})` : "masked (no loss)"];
      const v = s.versions ? s.versions[i] : null;
      if (v !== null && v !== undefined) lines.push(`generated by policy v${v}` + (changes.has(i) ? ` (the reply was at v${changes.get(i).from} before this token)` : ""));
      if (s.loss_mask[i]) {
        lines.push(`behaviour logprob ${fmt(s.logprobs[i], 4)}  (p=${fmt(Math.exp(s.logprobs[i]), 3)})`);
        lines.push(`trainer logprob   ${tlp === null || tlp === undefined ? "–" : fmt(tlp, 4) + "  (p=" + fmt(Math.exp(tlp), 3) + ")"}`);
        lines.push(`advantage ${s.trainer ? fmt(s.trainer.advantage, 4) : "– (not trained yet)"}`);
        if (s.trainer && s.trainer.logprobs && tlp === null) lines.push("masked at its step: older than max_staleness versions");
      }
      if (drift[i]) lines.push(`drift region: ${drift[i].status}, generated by call ${drift[i].call_index}`);
      tip.textContent = lines.join("\n");
      tip.style.display = "block";
      tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8) + "px";
      tip.style.top = (ev.clientY + 16) + "px";
    });
    box.addEventListener("mouseleave", () => { tip.style.display = "none"; });
    return box;
  }

  function header(t) {
    const rows = [["episode", t.episode_id], ["task", `${t.task_id} (${t.task_type})`], ["client", t.client_id],
      ["status", t.status + (t.consumed_step ? ` at step ${t.consumed_step}` : "")],
      ["reward", typeof t.reward === "object" ? JSON.stringify(t.reward) : fmt(t.reward)],
      ["policy versions", `began v${t.begin_policy_version}, oldest token v${t.min_policy_version}`], ["calls", t.calls]];
    if (t.report) rows.push(["tracking", `${t.report.samples} samples from ${t.report.calls} calls, ${t.report.merged_calls} merged, ` +
      `${t.report.drift_repaired} drift repairs` + (Object.keys(t.report.blocked || {}).length ? `, not merged: ${JSON.stringify(t.report.blocked)}` : "")]);
    const table = el("table", { class: "kv" }, ...rows.map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", { text: String(v) }))));
    const box = el("div", {}, table);
    if (t.team) {
      const links = Object.entries(t.team.roles).map(([role, url]) => {
        let href = null;
        try { const u = new URL("/dashboard/trace", url); u.searchParams.set("team", t.team.team_id); href = u.href; } catch (e) { /* bad URL */ }
        return el("li", {}, role + ": ", href ? el("a", { href, class: "team-link", text: url }) : url);
      });
      box.append(el("h2", { text: `Team ${t.team.team_id}` }), el("p", { class: "muted", text: "The same team episode on each member server:" }), el("ul", {}, ...links));
    }
    return box;
  }

  function render(t) {
    main.replaceChildren(el("h1", { text: `Trace · ${t.episode_id}` }), header(t));
    const select = el("select", { id: "color-mode" }, ...MODES.map(([v, label]) => el("option", { value: v, selected: v === mode, text: label })));
    const leg = el("div", {}, legend());
    select.addEventListener("change", () => { mode = select.value; draw(); leg.replaceChildren(legend()); });
    main.append(el("h2", { text: "Samples" }), el("label", {}, "colour tokens by ", select), leg);
    const area = el("div", {});
    main.append(area);
    function draw() {
      area.replaceChildren(...t.samples.map((s, si) => el("div", { class: "sample" },
        el("div", {}, el("b", { text: `sample ${si} · agent ${s.agent}` }),
          el("span", { class: "muted", text: `  ${s.calls.length} call(s) merged · ${s.num_tokens} tokens, ${s.num_trained_tokens} trained · weight ${fmt(s.weight)}` +
            (s.trainer ? ` · trained at step ${s.trainer.step} (v${s.trainer.policy_version}), advantage ${fmt(s.trainer.advantage, 4)}` : " · not trained yet") })),
        callsView(s), tokensView(s, si))));
    }
    draw();
  }

  async function load() {
    let id = q.get("episode");
    try {
      if (!id && q.get("team")) {
        const team = await api("/dashboard/api/teams/" + encodeURIComponent(q.get("team")));
        id = team.episodes[0];
        if (!id) throw new Error("no episode of team " + q.get("team") + " on this server");
      }
      if (!id) {
        main.replaceChildren(el("h1", { text: "Trace" }), el("p", {}, "Pick an episode on the ", el("a", { href: "/dashboard/episodes?status=trained", text: "Episodes" }), " page."));
        return;
      }
      render(await api("/dashboard/api/episodes/" + encodeURIComponent(id) + "/trace"));
      document.getElementById("live").textContent = "loaded " + new Date().toLocaleTimeString();
    } catch (e) {
      main.replaceChildren(el("h1", { text: "Trace" }), el("p", { class: "error", text: e.message }));
    }
  }
  load();
})();
