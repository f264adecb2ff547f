// mqd console, the management half: resource card, charts drawn as SVG
// from the page's own samples, topic create/update/delete, publish and
// browse. Loaded before app.js, which calls these functions; like app.js
// it puts data into the page only as text.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const COLORS = ["#2f6fed", "#1d8a4f", "#c62f3a", "#b86e00", "#7a3fd1", "#0f8a9d", "#8a6d1d", "#d13f8c"];
const BROWSE_PAGE = 20;

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

// ---- resources ----

function renderResources(c) {
  const r = c.resources;
  if (!r) return;
  $("#res-node").textContent = `(node ${c.self}, the one answering)`;
  const f = (label, value, bad) => { const d = fact(label, value); if (bad) d.className = "bad"; return d; };
  const files = r.open_files >= 0 ? `${fmtInt(r.open_files)} / ${fmtInt(r.open_files_limit)}` : "n/a";
  $("#res-facts").replaceChildren(
    f("disk free (min free)", `${fmtBytes(r.disk_free_bytes)} (${fmtBytes(r.disk_min_free_bytes)})`, r.disk_low),
    f("disk size", fmtBytes(r.disk_total_bytes)),
    f("memory (resident)", r.memory_rss_bytes ? fmtBytes(r.memory_rss_bytes) : "n/a"),
    f("Go heap", fmtBytes(r.go_heap_bytes)),
    f("open files / limit", files, r.open_files_limit > 0 && r.open_files * 10 > r.open_files_limit * 8),
    f("clock offset (max)", `${r.clock_offset_ms} ms (${r.max_clock_offset_ms} ms)${r.clock_known ? "" : ", not measured yet"}`, r.clock_bad),
    f("goroutines", fmtInt(r.goroutines)),
  );
  $("#alarms").replaceChildren(...(c.alarms || []).map((a) => el("li", {}, a)));
}

// ---- samples and charts ----

// sample records one reading of every topic's counters.
function sample(topics) {
  const s = { t: performance.now(), topics: {} };
  for (const t of topics) {
    if (!hasStats(t)) continue; // held elsewhere: no reading
    const groups = {};
    for (const [g, st] of Object.entries(t.groups || {})) {
      groups[g] = { acked: Number(st.acked), dlq: Number(st.dlq), backlog: Number(st.backlog), inflight: Number(st.in_flight) };
    }
    s.topics[t.name] = { pub: (t.partitions || []).reduce((a, p) => a + Number(p.next_offset), 0), groups };
  }
  state.history.push(s);
  if (state.history.length > HISTORY) state.history.shift();
}

// seriesOf builds one series per key from successive samples: value(s)
// gives a sample's reading (undefined: absent); rate turns readings into
// per-second growth (a drop, a deletion or a replay, reads as 0).
function seriesOf(keys, value, rate) {
  const h = state.history;
  return keys.map((k) => {
    const pts = [];
    for (let i = rate ? 1 : 0; i < h.length; i++) {
      const v = value(h[i], k);
      if (v === undefined) continue;
      if (!rate) { pts.push([h[i].t, v]); continue; }
      const p = value(h[i - 1], k);
      if (p === undefined) continue;
      pts.push([h[i].t, Math.max(0, (v - p) / ((h[i].t - h[i - 1].t) / 1000))]);
    }
    return { name: k, pts };
  }).filter((s) => s.pts.length > 0);
}

function groupKeys() {
  const keys = new Set();
  for (const s of state.history) {
    for (const [t, v] of Object.entries(s.topics)) {
      if (state.topic && t !== state.topic) continue;
      for (const g of Object.keys(v.groups)) keys.add(t + " / " + g);
    }
  }
  return [...keys].sort();
}

function groupValue(field) {
  return (s, k) => {
    const [t, g] = k.split(" / ");
    const v = s.topics[t] && s.topics[t].groups[g];
    return v ? v[field] : undefined;
  };
}

function renderCharts() {
  const topics = [...new Set(state.history.flatMap((s) => Object.keys(s.topics)))].sort();
  drawChart("#chart-publish", seriesOf(topics, (s, k) => (s.topics[k] ? s.topics[k].pub : undefined), true), true);
  const gk = groupKeys();
  drawChart("#chart-ack", seriesOf(gk, groupValue("acked"), true), true);
  drawChart("#chart-dlq", seriesOf(gk, groupValue("dlq"), true), true);
  drawChart("#chart-backlog", seriesOf(gk, groupValue("backlog"), false), false);
  drawChart("#chart-inflight", seriesOf(gk, groupValue("inflight"), false), false);
}

function fmtAxis(v, rate) {
  if (v >= 1000) return Math.round(v).toLocaleString("en-US");
  return rate && v < 10 ? v.toFixed(1) : String(Math.round(v));
}

// drawChart draws series as lines over the kept window, with the highest
// value on the y axis and a legend of (at most 8) names.
function drawChart(sel, series, rate) {
  const svg = $(sel);
  const W = 420, H = 160, L = 44, R = 8, T = 8, B = 18;
  const kids = [svgEl("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }),
    svgEl("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B })];
  const h = state.history;
  if (h.length < 2 || series.length === 0) {
    kids.push(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, h.length < 2 ? "collecting samples…" : "nothing to draw yet"));
    svg.replaceChildren(...kids);
    return;
  }
  const t0 = h[0].t, t1 = h[h.length - 1].t;
  const ymax = Math.max(rate ? 1 : 5, ...series.flatMap((s) => s.pts.map((p) => p[1])));
  const x = (t) => L + (W - L - R) * (t1 > t0 ? (t - t0) / (t1 - t0) : 1);
  const y = (v) => H - B - (H - T - B) * (v / ymax);
  kids.push(svgEl("text", { x: L - 4, y: T + 8, "text-anchor": "end" }, fmtAxis(ymax, rate)));
  kids.push(svgEl("text", { x: L - 4, y: H - B, "text-anchor": "end" }, "0"));
  kids.push(svgEl("text", { x: W - R, y: H - 4, "text-anchor": "end" }, "now"));
  kids.push(svgEl("text", { x: L, y: H - 4 }, `${Math.round((t1 - t0) / 1000)} s ago`));
  series.slice(0, COLORS.length).forEach((s, i) => {
    const d = s.pts.map((p, j) => `${j ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    const last = s.pts[s.pts.length - 1][1];
    kids.push(svgEl("path", { class: "series", d, stroke: COLORS[i], "data-series": s.name }));
    if (s.pts.length === 1) {
      const [pt] = s.pts;
      kids.push(svgEl("circle", { cx: x(pt[0]).toFixed(1), cy: y(pt[1]).toFixed(1), r: 2.5, fill: COLORS[i] }));
    }
    kids.push(svgEl("text", { x: L + 6, y: T + 10 + 11 * i, fill: COLORS[i] }, `${s.name}: ${fmtAxis(last, rate)}`));
  });
  svg.replaceChildren(...kids);
}

// ---- topic create, update, delete ----

function numField(sel) {
  const v = $(sel).value.trim();
  return v === "" ? undefined : Number(v);
}

async function saveTopic(ev) {
  ev.preventDefault();
  const name = $("#tf-name").value.trim();
  const body = {};
  for (const [sel, key] of [["#tf-partitions", "partitions"], ["#tf-max-retry", "max_retry"],
    ["#tf-ack-timeout", "ack_timeout_ms"], ["#tf-retention", "retention_ms"]]) {
    const v = numField(sel);
    if (v !== undefined) body[key] = v;
  }
  try {
    const t = await api("PUT", `/v1/topics/${enc(name)}`, body);
    banner(`Topic ${t.name} saved (${t.partitions.length} partition${t.partitions.length === 1 ? "" : "s"}).`, "info");
    state.topic = name;
    saveHash();
  } catch (e) { banner(explain(e, `save topic ${name}`)); }
  refresh();
}

function editTopic() {
  const t = state.topics.find((x) => x.name === state.topic);
  if (!t) return;
  $("#tf-name").value = t.name;
  $("#tf-partitions").value = (t.partitions || []).length;
  $("#tf-max-retry").value = t.config.max_retry;
  $("#tf-ack-timeout").value = t.config.ack_timeout_ms;
  $("#tf-retention").value = t.config.retention_ms;
  $("#tf-name").focus();
}

async function deleteTopic() {
  const name = state.topic;
  if (!name) return;
  const ok = await confirmAction(`Delete topic ${name} with all its messages, groups and dead letters? This cannot be undone.`, "Delete topic");
  if (!ok) return;
  try {
    await api("DELETE", `/v1/topics/${enc(name)}`);
    banner(`Topic ${name} deleted.`, "info");
    state.topic = state.group = null;
    saveHash();
  } catch (e) { banner(explain(e, `delete topic ${name}`)); }
  refresh();
}

// ---- publish ----

async function publishMessage(ev) {
  ev.preventDefault();
  const t = state.topic;
  const headers = { "Content-Type": "application/octet-stream" };
  const key = $("#pf-key").value.trim(), pkey = $("#pf-pkey").value.trim();
  if (key) headers["Idempotency-Key"] = key;
  if (pkey) headers["Mq-Partition-Key"] = pkey;
  try {
    const tok = token();
    if (tok) headers["Authorization"] = "Bearer " + tok;
    const r = await fetch(`/v1/topics/${enc(t)}/messages`, { method: "POST", headers, body: $("#pf-value").value, cache: "no-store" });
    const d = await r.json().catch(() => null);
    if (!r.ok) {
      const e = new Error(d && d.error ? d.error.message : `${r.status} ${r.statusText}`);
      e.status = r.status; e.code = d && d.error ? d.error.code : "";
      throw e;
    }
    banner(`Published to ${t}: partition ${d.partition}, offset ${d.offset}${d.duplicate ? " (a duplicate: stored once before)" : ""}.`, "info");
    $("#pf-value").value = "";
  } catch (e) { banner(explain(e, `publish to ${t}`)); }
  refresh();
}

// ---- browse ----

function resetBrowse() {
  state.browse = null;
  state.rendered.delete("#browse-table");
  $("#browse-table tbody").replaceChildren();
  $("#no-browse").hidden = true;
  $("#browse-next").disabled = true;
  $("#browse-where").textContent = "";
}

function fillPartitions(t) {
  const sel = $("#browse-partition");
  const want = (t.partitions || []).length;
  if (sel.options.length === want + 1) return;
  const keep = sel.value;
  sel.replaceChildren(el("option", { value: "" }, "all, in order"),
    ...(t.partitions || []).map((p) => el("option", { value: p.partition }, String(p.partition))));
  sel.value = keep;
}

// loadBrowse reads one page: the first (from), or the one after the last.
async function loadBrowse(first) {
  const t = state.topic;
  if (!t) return;
  if (first) state.browse = { next: null }; // one first page at a time
  const chosen = $("#browse-partition").value;
  const q = new URLSearchParams({ limit: BROWSE_PAGE });
  if (!first && state.browse && state.browse.next) {
    q.set("partition", state.browse.next.partition);
    q.set("offset", state.browse.next.offset);
  } else if (chosen !== "") {
    q.set("partition", chosen);
  }
  if (state.stale) q.set("stale", "ok");
  try {
    const pg = await api("GET", `/v1/topics/${enc(t)}/messages?${q}`);
    if (t !== state.topic) return;
    const parts = ((state.topics.find((x) => x.name === t) || {}).partitions || []).length;
    let next = { partition: pg.next_partition, offset: pg.next_offset };
    if (!pg.more) {
      // This partition is read to its end: all partitions go on with the next.
      next = chosen === "" && pg.next_partition + 1 < parts ? { partition: pg.next_partition + 1, offset: 0 } : null;
    }
    state.browse = { next };
    renderBrowse(pg, q);
  } catch (e) { banner(explain(e, `browse ${t}`)); }
}

function fmtAttrs(a) { return Object.entries(a || {}).map(([k, v]) => `${k}=${v}`).join(", "); }

function renderBrowse(pg, q) {
  const msgs = pg.messages || [];
  $("#no-browse").hidden = msgs.length > 0;
  $("#browse-next").disabled = !state.browse.next;
  $("#browse-where").textContent = msgs.length
    ? `partition ${msgs[0].partition} offset ${msgs[0].offset} to partition ${msgs[msgs.length - 1].partition} offset ${msgs[msgs.length - 1].offset}`
    : `from ${q.toString()}`;
  replaceRows("#browse-table", msgs, msgs.map((m) => el("tr", { "data-pos": `${m.partition}/${m.offset}` },
    el("td", { class: "num" }, m.partition), el("td", { class: "num" }, m.offset),
    el("td", { class: "mono" }, m.idempotency_key || ""),
    el("td", { class: "value mono" }, preview(m.value_b64)),
    el("td", { class: "mono" }, fmtAttrs(m.attrs)),
    el("td", { title: m.published_at }, fmtTime(m.published_at)))));
}

// ---- trace a key ----

function resetTrace() {
  $("#trace-result").hidden = true;
  $("#trace-table tbody").replaceChildren();
  $("#trace-where").textContent = "";
}

// traceKey asks where the message with the form's key is
// (GET /v1/topics/{t}/keys/{key}: answered from indexes, nothing consumed).
async function traceKey(ev) {
  ev.preventDefault();
  const t = state.topic;
  const key = $("#trace-key").value;
  if (!t || !key) return;
  resetTrace();
  const q = state.stale ? "?stale=ok" : "";
  try {
    const d = await api("GET", `/v1/topics/${enc(t)}/keys/${enc(key)}${q}`);
    if (t !== state.topic) return;
    const dups = d.duplicates === 1 ? "1 duplicate publish" : `${d.duplicates} duplicate publishes`;
    const at = d.published_at ? `, published ${fmtTime(d.published_at)}` : ", no longer stored (retention)";
    $("#trace-where").textContent = `${key}: partition ${d.partition} offset ${d.offset}${at}; ${dups} answered as duplicates.`;
    const groups = Object.entries(d.groups || {}).sort(([a], [b]) => a.localeCompare(b));
    $("#trace-table tbody").replaceChildren(...groups.map(([g, s]) => {
      const last = (s.history || [])[(s.history || []).length - 1];
      return el("tr", { "data-group": g },
        el("td", { class: "mono" }, g), el("td", { class: `state-${s.state}` }, s.state),
        el("td", { class: "num" }, s.deliveries),
        el("td", {}, last ? `${last.kind}: ${last.reason} (${fmtTime(last.at)})` : ""));
    }));
    $("#trace-table").hidden = groups.length === 0;
    $("#trace-result").hidden = false;
  } catch (e) {
    if (e.status === 404 && e.code === "key_not_found") {
      $("#trace-where").textContent = `No message with key ${key} in ${t} (or its dedup window has passed).`;
      $("#trace-table").hidden = true;
      $("#trace-result").hidden = false;
      return;
    }
    banner(explain(e, `trace ${key} in ${t}`));
  }
}

function initManage() {
  $("#trace-form").addEventListener("submit", traceKey);
  $("#topic-form").addEventListener("submit", saveTopic);
  $("#publish-form").addEventListener("submit", publishMessage);
  $("#topic-edit").addEventListener("click", editTopic);
  $("#topic-delete").addEventListener("click", deleteTopic);
  $("#browse-load").addEventListener("click", () => { resetBrowse(); loadBrowse(true); });
  $("#browse-next").addEventListener("click", () => loadBrowse(false));
  $("#browse-partition").addEventListener("change", () => { resetBrowse(); loadBrowse(true); });
}
