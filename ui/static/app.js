// mqd console: reads the HTTP API every few seconds and renders it.
// Plain JavaScript, no build step. All data goes into the page through
// textContent (never as HTML). The only state kept is the bearer token,
// in sessionStorage (this tab only).
"use strict";

const REFRESH_MS = 3000;
const DLQ_PAGE = 50;
const TOKEN_KEY = "mqd-token";

const state = {
  topic: null,        // selected topic
  group: null,        // selected group (its dead letters are shown)
  dlqAfter: 0,        // the dead-letter page shown starts after this id
  dlqNext: null,      // next page's "after", null on the last page
  rates: new Map(),   // topic -> {t, sum, rate}: publish rate from successive readings
  rendered: new Map(),// table id -> last rendered data, to skip unchanged redraws
  openHistory: new Set(), // dead-letter ids whose history is unfolded
  busy: false,        // a topics refresh is under way
  clusterBusy: false, // a cluster refresh is under way
  groupLeaders: new Map(), // data group id -> its leader, as the page's node knows it
  topics: [],
  history: [],        // samples {t, topics: {name: {pub, groups: {g: {acked, dlq, backlog}}}}}
  stale: null,        // when the topics shown came from ?stale=ok: {ms, index, node}
  browse: null,       // {partition: "" or n, next: {partition, offset} or null, more}
};
const HISTORY = 60;   // samples kept: 3 minutes at 3 s

const $ = (sel) => document.querySelector(sel);

// el builds an element: el("td", {class: "num"}, "text", child, ...).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

// api calls the HTTP API; an error answer throws with its status and code.
async function api(method, path, body, extraHeaders) {
  return (await apiFull(method, path, body, extraHeaders)).data;
}

// apiFull is api that also answers the response's headers.
async function apiFull(method, path, body, extraHeaders) {
  const headers = Object.assign({}, extraHeaders || {});
  const t = token();
  if (t) headers["Authorization"] = "Bearer " + t;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, {
    method, headers, cache: "no-store",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { /* not JSON */ }
  if (!r.ok) {
    const e = new Error(data && data.error ? data.error.message : `${r.status} ${r.statusText}`);
    e.status = r.status;
    e.code = data && data.error ? data.error.code : "";
    throw e;
  }
  return { data, headers: r.headers };
}

const enc = encodeURIComponent;
const groupPath = (t, g) => `/v1/topics/${enc(t)}/groups/${enc(g)}`;

// ---- formatting ----

function fmtInt(n) { return Number(n || 0).toLocaleString("en-US"); }

function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n || 0), i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? v : v.toFixed(1)) + " " + units[i];
}

function fmtRate(r) {
  if (r === undefined) return "—";
  return (r >= 100 ? Math.round(r).toLocaleString("en-US") : r.toFixed(1)) + "/s";
}

// fmtContact: ms since the answering node heard from a node (-1: never).
function fmtContact(ms) {
  if (ms === undefined || ms === null) return "";
  if (ms < 0) return "never";
  if (ms === 0) return "—";
  return ms < 10000 ? `${fmtInt(ms)} ms ago` : `${Math.round(ms / 1000)} s ago`;
}

function fmtTime(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  if (isNaN(d)) return iso;
  const pad = (x) => String(x).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function fmtAgo(iso) {
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (isNaN(s)) return "";
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return `${(s / 86400).toFixed(1)} d ago`;
}

// preview shows a payload as text when it is UTF-8, else its size and
// first bytes in hex.
function preview(b64) {
  let bytes;
  try { bytes = Uint8Array.from(atob(b64 || ""), (c) => c.charCodeAt(0)); } catch (_) { return "(not base64)"; }
  try {
    const s = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    return s.length > 200 ? s.slice(0, 200) + "…" : s;
  } catch (_) {
    const hex = Array.from(bytes.slice(0, 16), (b) => b.toString(16).padStart(2, "0")).join(" ");
    return `binary, ${bytes.length} bytes: ${hex}${bytes.length > 16 ? " …" : ""}`;
  }
}

// ---- banner, confirmation ----

function banner(text, kind) {
  const b = $("#banner");
  if (!text) { b.hidden = true; b.textContent = ""; return; }
  b.className = kind || "";
  b.textContent = text;
  b.hidden = false;
}

function explain(e, what) {
  if (e.status === 401) {
    $("#token").focus();
    return "This node requires a token: paste one above (it is kept in this browser tab only).";
  }
  if (e.status === 403) return `The token may not ${what}: ${e.message}`;
  return `Could not ${what}: ${e.message}`;
}

// confirmAction asks in a modal dialog; it resolves true on Confirm.
function confirmAction(text, okLabel) {
  return new Promise((resolve) => {
    const d = $("#confirm");
    $("#confirm-text").textContent = text;
    $("#confirm-ok").textContent = okLabel || "Confirm";
    d.returnValue = "";
    d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true });
    d.showModal();
  });
}

// ---- rendering ----

// replaceRows swaps a table's body, unless its data did not change.
function replaceRows(tableSel, data, rows) {
  const key = JSON.stringify(data);
  if (state.rendered.get(tableSel) === key) return;
  state.rendered.set(tableSel, key);
  $(tableSel + " tbody").replaceChildren(...rows);
}

function fact(label, value) { return el("div", {}, el("b", {}, value), el("span", {}, label)); }

function renderCluster(c) {
  const leader = c.leader ? c.leader.id : null;
  $("#node-summary").textContent = `node ${c.self} · leader ${leader || "none"}`;
  $("#cluster-facts").replaceChildren(
    fact("leader", leader || "none"),
    fact("nodes", c.nodes.length),
    fact("commit index", fmtInt(c.commit_index)),
    fact("applied index", fmtInt(c.applied_index)),
    fact("last snapshot index", fmtInt(c.last_snapshot_index)),
  );
  replaceRows("#nodes", c, c.nodes.map((n) => el("tr", { "data-node": n.id },
    el("td", {}, n.id, n.id === c.self ? el("span", { class: "muted" }, " (answering)") : null),
    el("td", {}, el("span", { class: "state " + n.state }, n.state)),
    el("td", {}, n.voter === false ? "no" : "yes"),
    el("td", { class: "num" }, fmtContact(n.last_contact_ms)),
    el("td", { class: "num" }, n.commit_index === undefined ? "" : fmtInt(n.commit_index)),
    el("td", { class: "num" }, n.applied_index === undefined ? "" : fmtInt(n.applied_index)),
    el("td", { class: "num" }, n.topics_led === undefined ? "" : fmtInt(n.topics_led)),
    el("td", { class: "num" }, n.topics_held === undefined ? "" : fmtInt(n.topics_held)),
    el("td", { class: "mono" }, n.http_addr || ""),
    el("td", { class: "mono" }, n.raft_addr || ""),
  )));
  renderDataGroups(c.groups || []);
}

// renderDataGroups lists the data groups (--data-groups): their members,
// the first of which is the preferred leader, the leader as the answering
// node knows it (every node learns every group's leader from its probes),
// and how many topics each holds. Without data groups the card stays
// hidden.
function renderDataGroups(groups) {
  state.groupLeaders = new Map(groups.filter((g) => g.leader).map((g) => [g.id, g.leader]));
  $("#data-groups-card").hidden = groups.length === 0;
  replaceRows("#data-groups", groups, groups.map((g) => el("tr", { "data-group-id": g.id },
    el("td", { class: "name" }, g.id),
    el("td", {}, ...(g.members || []).map((m, i) => el("span", {
      class: "member" + (i === 0 ? " preferred" : "") + (m === g.leader ? " leader" : ""),
      "data-member": m, title: i === 0 ? "preferred leader" : null,
    }, m, i === 0 ? el("span", { class: "preferred-mark" }, " ★") : null))),
    el("td", { class: "group-leader" }, g.leader
      ? el("span", {}, el("span", { class: "state leader" }, g.leader),
        g.members && g.members[0] !== g.leader ? el("span", { class: "muted" }, " not the preferred") : null)
      : el("span", { class: "muted", title: "the group has no leader now (an election is under way, or a majority of its members is down), or its leader runs a release that does not report it to the nodes outside the group" }, "not known here")),
    el("td", { class: "num" }, fmtInt(g.topics)))));
}

// hasStats: the topic list carries the topic's stats (a topic of a data
// group the answering node holds no replica of comes with its name and
// placement only).
function hasStats(t) { return Array.isArray(t.partitions); }

// placementOf is a topic's raft group and leader, for people. The topic
// list is answered by the metadata leader, which names each group's leader
// it knows; the page's node may know one it does not (renderDataGroups).
function placementOf(t) {
  const p = t.placement || {};
  const leader = p.leader || (p.group && state.groupLeaders.get(p.group)) || "";
  return { group: p.group || "default", leader, replicas: p.replicas || [] };
}

function clusterUnavailable(e) {
  $("#node-summary").textContent = e.status === 403 ? "cluster view needs the monitor permission" : "cluster unavailable";
  $("#cluster-facts").replaceChildren(el("div", { class: "muted" }, explain(e, "read the cluster")));
  replaceRows("#nodes", null, []);
  renderDataGroups([]);
}

// updateRates computes each topic's publish rate from the growth of its
// partitions' next offsets between two readings.
function updateRates(topics) {
  const now = performance.now();
  const seen = new Set();
  for (const t of topics) {
    seen.add(t.name);
    if (!hasStats(t)) { state.rates.set(t.name, { rate: undefined }); continue; }
    const sum = (t.partitions || []).reduce((a, p) => a + Number(p.next_offset), 0);
    let prev = state.rates.get(t.name);
    if (prev && prev.sum === undefined) prev = undefined; // its stats were elsewhere
    let rate = prev ? prev.rate : undefined;
    if (prev && now > prev.t && sum >= prev.sum) rate = (sum - prev.sum) / ((now - prev.t) / 1000);
    if (prev && sum < prev.sum) rate = undefined; // deleted and recreated
    state.rates.set(t.name, { t: now, sum, rate });
  }
  for (const k of state.rates.keys()) if (!seen.has(k)) state.rates.delete(k);
}

function groupsOf(t) { return Object.entries(t.groups || {}).sort(([a], [b]) => a.localeCompare(b)); }

function renderTopics(topics) {
  state.topics = topics;
  updateRates(topics);
  $("#no-topics").hidden = topics.length > 0;
  const rows = topics.map((t) => {
    const dlq = groupsOf(t).reduce((a, [, g]) => a + Number(g.dlq), 0);
    const pl = placementOf(t);
    const here = hasStats(t);
    const stat = (v) => (here ? v : el("span", { class: "muted", title: "held by other nodes: select the topic to load its stats" }, "—"));
    return el("tr", {
      class: "selectable" + (t.name === state.topic ? " selected" : ""), "data-topic": t.name,
      onclick: () => selectTopic(t.name),
    },
    el("td", {}, el("a", { href: viewHash(t.name, null), class: "name" }, t.name)),
    el("td", { class: "num" }, stat((t.partitions || []).length)),
    el("td", { class: "num" }, stat(fmtInt(t.messages))),
    el("td", { class: "num" }, stat(fmtBytes(t.bytes))),
    el("td", { class: "num rate" }, fmtRate(state.rates.get(t.name).rate)),
    el("td", { class: "num" }, stat(groupsOf(t).length)),
    el("td", { class: "num" + (dlq > 0 ? " warn" : "") }, stat(fmtInt(dlq))),
    el("td", { class: "raft-group" }, pl.group),
    el("td", { class: "topic-leader" }, pl.leader || el("span", { class: "muted" }, "unknown")));
  });
  const shown = topics.map((t) => [t, state.rates.get(t.name).rate, state.topic, placementOf(t).leader]);
  replaceRows("#topic-table", shown, rows);
  renderTopicDetail();
}

function renderTopicDetail() {
  const t = state.topics.find((x) => x.name === state.topic);
  $("#topic-detail").hidden = !t;
  if (!t) return;
  $("#detail-name").textContent = t.name;
  fillPartitions(t);
  if (!state.browse) loadBrowse(true);
  const c = t.config || {};
  $("#topic-facts").replaceChildren(
    fact("messages", fmtInt(t.messages)), fact("bytes", fmtBytes(t.bytes)),
    fact("publish rate", fmtRate(state.rates.get(t.name).rate)),
    fact("max retry", c.max_retry), fact("ack timeout", `${fmtInt(c.ack_timeout_ms)} ms`),
    fact("retention", c.retention_ms ? `${fmtInt(c.retention_ms)} ms` : "until acked"),
    fact("overflow", c.overflow || ""),
    fact("raft group", placementOf(t).group),
    fact("leader", placementOf(t).leader || "unknown"),
  );
  renderPlacement(t);
  replaceRows("#partition-table", t.partitions, (t.partitions || []).map((p) => el("tr", {},
    el("td", { class: "num" }, p.partition), el("td", { class: "num" }, fmtInt(p.first_offset)),
    el("td", { class: "num" }, fmtInt(p.next_offset)), el("td", { class: "num" }, fmtInt(p.messages)))));
  const groups = groupsOf(t);
  $("#no-groups").hidden = groups.length > 0;
  replaceRows("#group-table", [groups, state.group], groups.map(([name, g]) => el("tr", {
    class: "selectable" + (name === state.group ? " selected" : ""), "data-group": name,
    onclick: () => selectGroup(name),
  },
  el("td", {}, el("a", { href: viewHash(t.name, name), class: "name" }, name)),
  el("td", { class: "num" }, fmtInt(g.backlog)),
  el("td", { class: "num" }, fmtInt(g.in_flight)),
  el("td", { class: "num" }, fmtInt(g.delayed)),
  el("td", { class: "num" + (Number(g.dlq) > 0 ? " warn" : "") }, fmtInt(g.dlq)),
  el("td", { class: "num" }, fmtInt(g.replay_pending)),
  el("td", { class: "num" }, fmtInt(g.acked)),
  el("td", { class: "num" }, fmtInt(g.duplicates_skipped)),
  el("td", {}, el("button", { type: "button", class: "quiet show-dlq" }, "Dead letters")))));
}

// renderPlacement shows where a topic's replicas are (SPEC section 12):
// the nodes holding it, its leader marked.
function renderPlacement(t) {
  const pl = placementOf(t);
  $("#topic-placement").replaceChildren(
    el("span", { class: "muted" }, `Replicas (${pl.replicas.length}) in raft group ${pl.group}: `),
    ...pl.replicas.map((r) => el("span", { class: "member" + (r === pl.leader ? " leader" : ""), "data-replica": r },
      r, r === pl.leader ? el("span", { class: "muted" }, " leader") : null)));
}

function historyList(d) {
  return el("ul", { class: "history" }, ...(d.history || []).map((h) => el("li", {},
    el("span", { class: "kind " + h.kind }, h.kind),
    el("span", { class: "mono", title: h.at }, fmtTime(h.at)),
    h.node ? el("span", { class: "muted" }, ` on ${h.node}`) : null,
    h.reason ? el("div", {}, h.reason) : null)));
}

function renderDLQ(page) {
  const letters = page.dead_letters || [];
  $("#no-dlq").hidden = letters.length > 0;
  $("#dlq-older").hidden = page.next_after === null || page.next_after === undefined;
  $("#dlq-first").hidden = state.dlqAfter === 0;
  $("#replay-all").disabled = letters.length === 0;
  replaceRows("#dlq-table", [letters, [...state.openHistory]], letters.map((d) => {
    const details = el("details", {
      open: state.openHistory.has(d.id),
      ontoggle: (ev) => { if (ev.target.open) state.openHistory.add(d.id); else state.openHistory.delete(d.id); },
    }, el("summary", {}, `history (${(d.history || []).length})`), historyList(d));
    return el("tr", { "data-dlq-id": d.id },
      el("td", { class: "num" }, d.id),
      el("td", { class: "mono" }, `p${d.partition} @ ${d.offset}`),
      el("td", { class: "mono" }, d.idempotency_key || ""),
      el("td", { class: "value mono" }, preview(d.value_b64)),
      el("td", {}, el("div", { class: "reason" }, d.reject_reason || ""), details),
      el("td", { class: "num" }, d.retry_count),
      el("td", { title: d.dead_at }, fmtAgo(d.dead_at)),
      el("td", {},
        el("button", { type: "button", class: "replay", onclick: () => replay(d) }, "Replay"), " ",
        el("button", { type: "button", class: "danger delete", onclick: () => discard(d) }, "Delete")));
  }));
}

// ---- selection ----

// viewHash is the address of a view: #topic=T&group=G.
function viewHash(topic, group) {
  const p = new URLSearchParams();
  if (topic) p.set("topic", topic);
  if (group) p.set("group", group);
  return p.toString() ? "#" + p.toString() : location.pathname;
}

function saveHash() { history.replaceState(null, "", viewHash(state.topic, state.group)); }

// followHash selects what the address names (a link was followed, or the
// user edited the address).
function followHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  const topic = p.get("topic"), group = p.get("group");
  if (topic !== state.topic) selectTopic(topic);
  if (group && group !== state.group) selectGroup(group);
  else if (!group && state.group) closeDLQ();
}

function closeDLQ() {
  state.group = null;
  saveHash();
  $("#dlq").hidden = true;
  renderTopicDetail();
}

function selectTopic(name) {
  if (state.topic !== name) { state.group = null; $("#dlq").hidden = true; resetBrowse(); resetTrace(); }
  state.topic = name;
  saveHash();
  renderTopics(state.topics);
  const t = state.topics.find((x) => x.name === name);
  if (t && !hasStats(t)) refresh(); // its stats come from a member of its group
}

function selectGroup(name) {
  state.group = name;
  state.dlqAfter = 0;
  state.openHistory.clear();
  state.rendered.delete("#dlq-table");
  saveHash();
  renderTopicDetail();
  loadDLQ();
}

async function loadDLQ() {
  const t = state.topic, g = state.group;
  if (!t || !g) { $("#dlq").hidden = true; return; }
  $("#dlq").hidden = false;
  $("#dlq-name").textContent = `${t} / ${g}`;
  try {
    const stale = state.stale ? "&stale=ok" : "";
    const page = await api("GET", `${groupPath(t, g)}/dlq?limit=${DLQ_PAGE}&after=${state.dlqAfter}${stale}`);
    if (t !== state.topic || g !== state.group) return;
    state.dlqNext = page.next_after;
    renderDLQ(page);
  } catch (e) {
    if (e.code === "group_not_found" || e.code === "topic_not_found") {
      state.group = null; saveHash(); $("#dlq").hidden = true; return;
    }
    banner(explain(e, "list dead letters"), "refresh");
  }
}

// ---- actions ----

async function replay(d) {
  const t = state.topic, g = state.group;
  const ok = await confirmAction(`Replay dead letter ${d.id} of ${t} / ${g}? It goes back into the group's delivery with its retry count reset.`, "Replay");
  if (!ok) return;
  try {
    const r = await api("POST", `${groupPath(t, g)}/dlq/replay`, { ids: [d.id] });
    banner(`Replay of dead letter ${d.id} accepted (${r.accepted}).`, "info");
  } catch (e) { banner(explain(e, "replay")); }
  refresh();
}

async function discard(d) {
  const t = state.topic, g = state.group;
  const ok = await confirmAction(`Delete dead letter ${d.id} of ${t} / ${g}? The message is discarded for this group; this cannot be undone.`, "Delete");
  if (!ok) return;
  try {
    await api("DELETE", `${groupPath(t, g)}/dlq/${d.id}`);
    banner(`Dead letter ${d.id} deleted.`, "info");
  } catch (e) { banner(explain(e, "delete")); }
  refresh();
}

async function replayAll() {
  const t = state.topic, g = state.group;
  const ok = await confirmAction(`Replay every dead letter of ${t} / ${g} (at 100 per second)?`, "Replay all");
  if (!ok) return;
  try {
    const r = await api("POST", `${groupPath(t, g)}/dlq/replay`, { all: true });
    banner(`Replay of ${r.accepted} dead letters accepted; they go back at ${r.rate_per_sec}/s.`, "info");
  } catch (e) { banner(explain(e, "replay")); }
  refresh();
}

// ---- refresh loop ----

// noLeader: an answer that says the cluster has no leader right now.
function noLeader(e) { return e && e.status === 503 && (e.code === "no_leader" || e.code === "no_quorum"); }

// refreshCluster draws the cluster and resource cards on their own: a
// slow or failing topic list never holds them back.
async function refreshCluster() {
  if (state.clusterBusy) return;
  state.clusterBusy = true;
  try {
    const c = await api("GET", "/v1/cluster");
    renderCluster(c);
    renderResources(c);
  } catch (e) {
    clusterUnavailable(e);
  } finally {
    state.clusterBusy = false;
  }
}

// loadTopics reads the topic list from the leader; without one it reads
// the answering node's own state (?stale=ok) and says how old it may be.
async function loadTopics() {
  try {
    const d = await api("GET", "/v1/topics");
    state.stale = null;
    return withSelectedStats(d.topics || [], "");
  } catch (e) {
    if (!noLeader(e)) throw e;
    const r = await apiFull("GET", "/v1/topics?stale=ok");
    state.stale = { ms: Number(r.headers.get("Mq-Stale-Ms")), index: r.headers.get("Mq-Applied-Index"), why: e.message };
    return withSelectedStats(r.data.topics || [], "?stale=ok");
  }
}

// withSelectedStats reads the selected topic's stats on their own when the
// list came without them (its data group has no replica on the answering
// node, which forwards the request to one that has).
async function withSelectedStats(topics, query) {
  const i = topics.findIndex((t) => t.name === state.topic);
  if (i < 0 || hasStats(topics[i])) return topics;
  try {
    topics[i] = await api("GET", `/v1/topics/${enc(state.topic)}${query}`);
  } catch (_) { /* the list's entry stays: name and placement */ }
  return topics;
}

function renderStale() {
  // Without a leader nothing can change: the page's writes wait.
  for (const sel of ["#tf-save", "#pf-send", "#topic-delete", "#replay-all"]) {
    const btn = $(sel);
    if (state.stale) btn.dataset.stale = "1";
    if (btn.dataset.stale) { btn.disabled = !!state.stale; if (!state.stale) delete btn.dataset.stale; }
  }
  const b = $("#stale");
  if (!state.stale) { b.hidden = true; b.textContent = ""; return; }
  const age = state.stale.ms >= 0 ? `${Math.round(state.stale.ms / 1000)} s` : "an unknown time";
  b.textContent = `No leader: the cluster has no quorum. Showing this node's own state (raft index ${state.stale.index}), ` +
    `which may be ${age} old; changes cannot be made until a majority of the nodes is back.`;
  b.hidden = false;
}

async function refresh() {
  refreshCluster();
  if (state.busy) return;
  state.busy = true;
  try {
    let topics;
    try {
      topics = await loadTopics();
    } catch (e) {
      banner(explain(e, "list topics"), "refresh");
      return;
    }
    sample(topics);
    renderTopics(topics);
    renderStale();
    renderCharts();
    if (state.topic && !state.topics.some((t) => t.name === state.topic)) { state.topic = state.group = null; saveHash(); }
    await loadDLQ();
    const b = $("#banner");
    if (!b.hidden && b.className === "refresh") banner(""); // a refresh's error, not an action's
  } finally {
    state.busy = false;
    $("#updated").textContent = "updated " + new Date().toLocaleTimeString();
  }
}

function init() {
  const p = new URLSearchParams(location.hash.slice(1));
  state.topic = p.get("topic");
  state.group = p.get("group");
  $("#token").value = token();
  $("#token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const v = $("#token").value.trim();
    if (v) sessionStorage.setItem(TOKEN_KEY, v); else sessionStorage.removeItem(TOKEN_KEY);
    banner("");
    state.rendered.clear();
    refresh();
  });
  $("#token-clear").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    $("#token").value = "";
    state.rendered.clear();
    refresh();
  });
  initManage();
  $("#replay-all").addEventListener("click", replayAll);
  $("#dlq-close").addEventListener("click", closeDLQ);
  window.addEventListener("hashchange", followHash);
  $("#dlq-older").addEventListener("click", () => { if (state.dlqNext !== null) { state.dlqAfter = state.dlqNext; loadDLQ(); } });
  $("#dlq-first").addEventListener("click", () => { state.dlqAfter = 0; loadDLQ(); });
  setInterval(() => { if ($("#auto").checked && !$("#confirm").open) refresh(); }, REFRESH_MS);
  refresh();
}

document.addEventListener("DOMContentLoaded", init);
