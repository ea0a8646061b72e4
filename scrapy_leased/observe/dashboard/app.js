// scrapy_leased dashboard: polls /api/snapshot (what `scrapy leased status --json`
// prints, plus a short history and some dead letters) and redraws in place. No build
// step, no dependencies; plots are drawn as SVG here.
"use strict";

const params = new URLSearchParams(location.search);
const INTERVAL_MS = 1000 * (Number(params.get("interval")) || 2);
const DEAD_ROWS = Number(params.get("dead_rows")) || 10; // dead letters listed, newest first
const $ = (sel) => document.querySelector(sel);
const state = { crawl: params.get("crawl"), allowWrites: false, timer: null, pending: null };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "onclick") e.onclick = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}
const fmt = (n, digits = 0) => n === null || n === undefined ? "?" :
  Number(n).toLocaleString("en-US", { maximumFractionDigits: digits });
const age = (s) => s < 60 ? `${s.toFixed(1)} s` : s < 3600 ? `${(s / 60).toFixed(1)} min` : `${(s / 3600).toFixed(1)} h`;
const when = (t) => new Date(t * 1000).toLocaleString();

function setValue(node, value, digits) {
  node.dataset.value = value === undefined || value === null ? "" : String(value);
  node.textContent = value === undefined ? "-" : fmt(value, digits);
}

function fillTable(sel, rows, empty) {
  const body = $(sel + " tbody");
  body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "empty", colspan: 9 }, empty))]));
}

function plot(svg, points, series) {
  const W = 600, H = 160, pad = 22;
  const ns = "http://www.w3.org/2000/svg";
  const mk = (tag, attrs) => { const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); return e; };
  const nodes = [];
  const t0 = points.length ? points[0].time : 0, t1 = points.length ? points[points.length - 1].time : 1;
  let max = 1;
  for (const p of points) for (const [key] of series) max = Math.max(max, p[key]);
  const x = (t) => pad + (W - 2 * pad) * (t1 > t0 ? (t - t0) / (t1 - t0) : 1);
  const y = (v) => H - pad - (H - 2 * pad) * v / max;
  for (const f of [0, 0.5, 1]) {
    nodes.push(mk("line", { class: "grid", x1: pad, x2: W - pad, y1: y(max * f), y2: y(max * f) }));
    const label = mk("text", { x: 2, y: y(max * f) + 3 }); label.textContent = fmt(max * f); nodes.push(label);
  }
  const span = mk("text", { x: W - pad, y: H - 6, "text-anchor": "end" });
  span.textContent = points.length > 1 ? `last ${age(t1 - t0)}` : "collecting samples";
  nodes.push(span);
  for (const [key, color] of series) {
    if (!points.length) continue;
    const d = points.map((p, i) => `${i ? "L" : "M"}${x(p.time).toFixed(1)},${y(p[key]).toFixed(1)}`).join("");
    nodes.push(mk("path", { d, fill: "none", stroke: color, "stroke-width": 2, "data-series": key }));
  }
  svg.replaceChildren(...nodes);
}

function askConfirm(text) {
  return new Promise((resolve) => {
    $("#confirm-text").textContent = text;
    $("#confirm").classList.add("open");
    const done = (ok) => { $("#confirm").classList.remove("open"); resolve(ok); };
    $("#confirm-yes").onclick = () => done(true);
    $("#confirm-no").onclick = () => done(false);
  });
}

async function deadAction(action, what, body) {
  if (!await askConfirm(`${action === "requeue" ? "Requeue" : "Purge for good"} ${what}?`)) return;
  const r = await fetch("api/dead", { method: "POST", body: JSON.stringify({ crawl: state.crawl, action, ...body }),
    headers: { "Content-Type": "application/json", "X-Leased-Dashboard": "1" } });
  $("#error").textContent = r.ok ? "" : `${action}: ${await r.text()}`;
  refresh();
}

function render(data) {
  const s = data.status;
  document.body.dataset.now = String(s.time);
  $("#updated").textContent = `Redis time ${when(s.time)}`;
  for (const node of document.querySelectorAll("#counters [data-field]")) {
    const f = node.dataset.field;
    if (f === "pages_per_min") setValue(node, s.throughput.pages_per_min, 1); else setValue(node, s[f]);
  }
  for (const node of document.querySelectorAll("#counters [data-control]")) {
    // the fleet's control state: running, paused or stopping (scrapy leased pause/stop)
    const c = s.control || {};
    node.dataset.value = c.state || "running";
    node.textContent = (c.state || "running") + (c.reason ? ` (${c.reason})` : "");
  }
  for (const node of document.querySelectorAll("#counters [data-stat]")) setValue(node, s.stats[node.dataset.stat] ?? 0);
  plot($("#plot-throughput"), data.history, [["pages_per_min", "var(--green)"]]);
  plot($("#plot-queue"), data.history, [["todo", "var(--blue)"], ["processing", "var(--orange)"], ["dead", "var(--red)"]]);

  const warn = $("#warnings");
  warn.className = s.warnings.length ? "" : "ok";
  warn.replaceChildren(...(s.warnings.length ? s.warnings.map((w) => el("li", { "data-code": w.code }, w.message))
    : [el("li", { class: "empty" }, s.sample_s ? `no warnings (trends over ${s.sample_s.toFixed(1)} s)` : "no warnings yet (trends need a second sample)")]));

  fillTable("#workers", s.workers.map((w) => el("tr", { "data-worker": w.id, class: w.alive ? "" : "empty" },
    el("td", {}, w.id + (w.alive ? "" : " (gone)")), el("td", { class: "n" }, age(w.heartbeat_age_s) + " ago"),
    el("td", { class: "n" }, fmt(w.inflight)), el("td", { class: "n" }, fmt(w.acked)),
    el("td", { class: "n" }, fmt(w.capacity)),
    el("td", { class: "n" }, fmt((s.leases_by_worker || {})[w.id] ?? 0)))), "no workers");

  fillTable("#hosts", s.budget.lanes.map((l) => el("tr", { "data-host": l.lane },
    el("td", {}, l.lane || "(default)"), el("td", { class: "n" }, fmt(l.queued)), el("td", {}, l.budget),
    el("td", { class: "n" }, l.ahead_s.toFixed(1) + " s"), el("td", { class: "n" }, l.ready_in_s.toFixed(1) + " s"),
    el("td", { class: "n" }, l.blocked_s.toFixed(1) + " s"), el("td", { class: "n" }, l.slowdown.toFixed(2) + "x"))),
    "no host with queued requests");
  const more = s.budget.lanes_total - s.budget.lanes.length;
  $("#hosts-more").textContent = more > 0 ? `... ${fmt(more)} more hosts with queued requests` : "";

  const writes = data.allow_writes;
  const letters = data.dead_letters.slice(0, DEAD_ROWS);
  fillTable("#dead", letters.map((d) => el("tr", { "data-rid": d.rid },
    el("td", {}, when(d.time)), el("td", {}, d.url ? `${d.method} ${d.url}` : "(unreadable envelope)"),
    el("td", { class: "n" }, d.dropped ? "dropped" : d.attempts), el("td", { class: "reason" }, d.reason),
    el("td", {}, ...(writes ? [
      ...(d.dropped ? [] : [el("button", { class: "requeue", onclick: () => deadAction("requeue", d.url || d.rid, { rids: [d.rid] }) }, "requeue"), " "]),
      el("button", { class: "purge danger", onclick: () => deadAction("purge", d.url || d.rid, { rids: [d.rid] }) }, "purge")] : [])))),
    "no dead letters");
  $("#dead-actions").replaceChildren(
    el("span", { class: "empty" }, s.dead > letters.length ? `(${fmt(letters.length)} of ${fmt(s.dead)} shown) ` : ""),
    ...(writes && s.dead ? [
      el("button", { class: "requeue-all", onclick: () => deadAction("requeue", `all ${fmt(s.dead)} dead letters`, { all: true }) }, "requeue all"), " ",
      el("button", { class: "purge-all danger", onclick: () => deadAction("purge", `all ${fmt(s.dead)} dead letters`, { all: true }) }, "purge all")] : []));

  $("#stats").replaceChildren(...Object.entries(s.stats).map(([k, v]) =>
    el("div", { "data-stat": k }, el("span", {}, k), el("span", { "data-value": v }, k.endsWith("_time") ? when(v) : fmt(v, 3)))));
}

async function refresh() {
  clearTimeout(state.timer);
  try {
    if (state.crawl) {
      const r = await fetch(`api/snapshot?crawl=${encodeURIComponent(state.crawl)}`);
      if (!r.ok) throw new Error(await r.text());
      render(await r.json());
      $("#error").textContent = "";
    }
  } catch (e) {
    $("#error").textContent = `cannot read: ${e.message}`;
  }
  state.timer = setTimeout(refresh, INTERVAL_MS);
}

async function start() {
  const r = await fetch("api/crawls");
  const info = await r.json();
  state.allowWrites = info.allow_writes;
  $("#mode").textContent = info.allow_writes ? "writes allowed" : "read-only";
  $("#mode").className = info.allow_writes ? "writes" : "";
  if (!state.crawl) state.crawl = info.default;
  const names = state.crawl && !info.crawls.includes(state.crawl) ? [...info.crawls, state.crawl] : info.crawls;
  const picker = $("#crawl");
  picker.replaceChildren(...names.map((c) => el("option", { value: c }, c)));
  if (state.crawl) picker.value = state.crawl;
  picker.onchange = () => {
    state.crawl = picker.value;
    history.replaceState(null, "", `?crawl=${encodeURIComponent(state.crawl)}`);
    refresh();
  };
  refresh();
}

start();
