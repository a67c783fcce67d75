"use strict";
// Run page: the snapshot tiles and the curves of every train step (polled incrementally).
(() => {
  const { el, api, poll, nav, fmt, Chart, bars } = AJ;
  nav("run");
  const main = document.getElementById("main");
  const title = el("h1", { text: "Run" });
  const tiles = el("div", { class: "tiles" });
  const adapters = el("table", { id: "adapters", hidden: true });
  const tinker = el("table", { id: "tinker", hidden: true });
  const replicas = el("table", { id: "replicas", hidden: true });
  // a server with several LoRA adapters: the step curves are one adapter's (each trains on its own steps)
  const adapterPick = el("select", { id: "adapter-pick" });
  const pickLabel = el("label", { hidden: true }, "step curves of adapter ", adapterPick);
  const grid = el("div", { class: "grid" });
  main.append(title, tiles, replicas, adapters, tinker, pickLabel, grid);

  const charts = {
    reward: new Chart(grid, "Train reward per task type"),
    agent: new Chart(grid, "Train reward per agent role"),
    eval: new Chart(grid, "Eval reward per task type / agent", { xLabel: "policy version" }),
    tokens: new Chart(grid, "Tokens per second"),
    time: new Chart(grid, "Step time split (s)"),
    dropped: new Chart(grid, "Dropped episodes by reason (total)"),
    merge: new Chart(grid, "Timeline merging"),
    drift: new Chart(grid, "Drift repairs"),
    loss: new Chart(grid, "Loss and policy drift"),
    stale: new Chart(grid, "Staleness of trained episodes (versions)"),
  };
  const staleHist = bars(grid, "Staleness histogram (trained episodes, all steps)");

  const steps = [];
  let last = -1;
  let evalCount = -1;
  let adapter = null; // the adapter whose steps the curves show (null: the server's one policy)
  adapterPick.addEventListener("change", () => {
    adapter = adapterPick.value;
    steps.length = 0;
    last = -1;
  });
  let evals = [];

  function pick(prefix, rename) {
    const names = new Set();
    for (const s of steps) for (const k of Object.keys(s.metrics)) if (k.startsWith(prefix)) names.add(k);
    const out = {};
    for (const k of names) out[rename ? rename(k) : k] = steps.map((s) => (k in s.metrics ? s.metrics[k] : null));
    return out;
  }
  function only(keys) {
    const out = {};
    for (const [k, label] of Object.entries(keys)) {
      if (steps.some((s) => k in s.metrics)) out[label] = steps.map((s) => (k in s.metrics ? s.metrics[k] : null));
    }
    return out;
  }

  function renderTiles(s) {
    const dropped = Object.values(s.dropped).reduce((a, b) => a + b, 0);
    const items = [
      ["model", s.model], ["state", s.engine_state], ["policy version", s.learner_version > s.policy_version
        ? `${s.policy_version} (learner v${s.learner_version}${s.weight_push_in_flight ? ", pushing" : ""})` : s.policy_version],
      ["train steps", s.train_steps], ["open episodes", s.open_episodes], ["pending", s.pending_episodes],
      ["trained episodes", s.trained_episodes], ["eval episodes", s.eval_episodes], ["clients", s.clients],
      ["chat calls", s.calls], ["generated tokens", s.generated_tokens], ["trained tokens", s.trained_tokens],
      ["dropped", dropped], ["uptime", fmt(s.uptime_s / 60, 1) + " min"],
    ];
    if (s.weight_syncs !== null && s.weight_syncs !== undefined) {
      items.push(["weight syncs", s.weight_sync_failures ? `${fmt(s.weight_syncs)} (${fmt(s.weight_sync_failures)} failed)`
        : s.weight_syncs]);
    }
    tiles.replaceChildren(...items.map(([k, v]) => el("div", { class: "tile" }, el("div", { class: "k", text: k }),
      el("div", { class: "v", text: typeof v === "number" ? fmt(v) : v }))));
    title.textContent = `Run · ${s.model} · policy v${s.policy_version}`;
  }

  // one row per LoRA adapter (a server that hosts several on one base; each trains on its own)
  function renderAdapters(s) {
    const rows = Object.entries(s.adapters || {});
    adapters.hidden = rows.length === 0;
    pickLabel.hidden = rows.length === 0;
    if (!rows.length) return;
    const names = rows.map(([name]) => name);
    if (names.join("\n") !== [...adapterPick.options].map((o) => o.value).join("\n")) {
      const current = adapter || names[0];
      adapterPick.replaceChildren(...names.map((n) => el("option", { value: n, selected: n === current, text: n })));
      adapter = current;
    }
    const cols = ["adapter", "policy version", "train steps", "trained episodes", "pending", "reward (last step)",
      "loss (last step)"];
    const head = el("tr", {}, ...cols.map((c, i) => el("th", { class: i ? "num" : null, text: c })));
    const num = (v) => el("td", { class: "num", text: v === null || v === undefined ? "–" : fmt(v) });
    adapters.replaceChildren(head, ...rows.map(([name, a]) => el("tr", {}, el("td", { text: name }),
      num(a.policy_version), num(a.train_steps), num(a.trained_episodes), num(a.pending_episodes),
      num(a.last_train_metrics.reward_mean), num(a.last_train_metrics.loss))));
  }

  // the Tinker API's clients (a server with --tinker-key): one row per training client, its own LoRA adapter
  function renderTinker(s) {
    const t = s.tinker;
    tinker.hidden = !t;
    if (!t) return;
    const rows = Object.entries(t.training_clients || {});
    const cols = ["Tinker training client", "session", "rank", "steps", "forward_backward", "loss (last)"];
    const head = el("tr", {}, ...cols.map((c, i) => el("th", { class: i > 1 ? "num" : null, text: c })));
    const num = (v) => el("td", { class: "num", text: v === null || v === undefined ? "–" : fmt(v) });
    const summary = el("tr", {}, el("td", { text: `${fmt(t.sessions)} sessions, ${fmt(rows.length)} training clients, `
      + `${fmt(t.sampling_clients)} sampling clients`, colspan: cols.length }));
    tinker.replaceChildren(summary, head, ...rows.map(([id, c]) => el("tr", {}, el("td", { text: id }),
      el("td", { text: c.session_id }), num(c.rank), num(c.steps), num(c.forward_backward_calls), num(c.last_loss))));
  }

  // the generator replicas behind the router (a fleet): one row each, the router's counts above them
  function renderReplicas(s) {
    const f = s.fleet;
    replicas.hidden = !f;
    if (!f) return;
    const cols = ["replica", "state", "where", "policy version", "in flight", "sessions", "calls", "failed calls",
      "restarts", "pushes", "last push (s)"];
    const head = el("tr", {}, ...cols.map((c, i) => el("th", { class: i > 2 ? "num" : null, text: c })));
    const num = (v) => el("td", { class: "num", text: v === null || v === undefined ? "–" : fmt(v) });
    const summary = el("tr", {}, el("td", { colspan: cols.length, text: `${fmt(f.serving)} of ${fmt(f.replicas.length)} `
      + `replicas in rotation · ${fmt(f.routed_calls)} calls routed, ${fmt(f.affinity_hits)} to their session's `
      + `replica, ${fmt(f.new_sessions)} new sessions · ${fmt(f.failovers)} calls moved on `
      + `(${fmt(f.failover_tokens)} tokens kept) · ${fmt(f.unavailable)} found no replica` }));
    replicas.replaceChildren(summary, head, ...f.replicas.map((r) => el("tr", { title: r.out_reason || "" },
      el("td", { text: r.name }), el("td", { text: r.state }), el("td", { text: r.where }), num(r.policy_version),
      num(r.in_flight), num(r.sessions), num(r.calls), num(r.failed_calls), num(r.restarts), num(r.pushes),
      num(r.last_push_s))));
  }

  function renderCharts() {
    const xs = steps.map((s) => s.step);
    charts.reward.set(xs, { ...pick("reward/", (k) => k.slice(7)), mean: steps.map((s) => s.metrics.reward_mean ?? null) });
    charts.agent.set(xs, pick("reward_agent/", (k) => k.slice(13)));
    charts.tokens.set(xs, only({ "throughput/generated_tokens_per_s": "generated", "throughput/trained_tokens_per_s": "trained" }));
    charts.time.set(xs, only({ "time/waiting_s": "waiting", "time/prepare_s": "prepare", "time/training_s": "training", "time/sync_s": "sync" }));
    charts.dropped.set(xs, pick("dropped/", (k) => k.slice(8)));
    charts.merge.set(xs, only({ "merge/ratio": "merged calls / calls", "merge/token_ratio": "tokens unmerged / merged" }));
    charts.drift.set(xs, only({ "drift/repaired": "repaired in step window", "drift/repaired_total": "total" }));
    charts.loss.set(xs, only({ loss: "loss", kl: "kl", clip_frac: "clip frac", mean_abs_logprob_diff: "|trainer - behaviour| logprob" }));
    charts.stale.set(xs, only({ "staleness/mean": "mean", "staleness/max": "max" }));
    const hist = {};
    for (const s of steps) for (const [k, v] of Object.entries(s.metrics)) {
      if (k.startsWith("staleness/hist/")) { const b = k.slice(15); hist[b] = (hist[b] || 0) + v; }
    }
    staleHist(hist);
  }

  function renderEvals() {
    const versions = [...new Set(evals.map((e) => e.policy_version))].sort((a, b) => a - b);
    const series = {};
    for (const e of evals) {
      // one curve per task type, difficulty level (noted by the client: ajet demo --levels) and agent
      const type = e.level === null || e.level === undefined ? e.task_type : `${e.task_type} · level ${e.level}`;
      const name = e.agent === "*" ? type : `${type} · ${e.agent}`;
      if (!series[name]) series[name] = versions.map(() => null);
      series[name][versions.indexOf(e.policy_version)] = e.reward_mean;
    }
    charts.eval.set(versions, series);
  }

  poll(async () => {
    const wantEvals = evalCount < 0;
    const asked = adapter;
    const which = asked === null ? "" : `&adapter=${encodeURIComponent(asked)}`;
    const data = await api(`/dashboard/api/run?after=${last}&evals=${wantEvals}${which}`);
    renderTiles(data.snapshot);
    renderAdapters(data.snapshot);
    renderTinker(data.snapshot);
    renderReplicas(data.snapshot);
    if (asked !== adapter) return; // the adapter changed while this poll was in flight: the next one asks again
    for (const s of data.steps) { steps.push(s); last = s.step; }
    if (data.steps.length || !charts.reward.plot || last === -1) renderCharts();
    if (data.evals) { evals = data.evals; renderEvals(); }
    // fetch the eval curves again only when new eval episodes arrived
    evalCount = data.evals ? data.snapshot.eval_episodes : (data.snapshot.eval_episodes !== evalCount ? -1 : evalCount);
  }, 2000);
})();
