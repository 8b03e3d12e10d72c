// The live view: slots, queue, throughput, TTFT and where each prompt's KV came from, fed by
// /v1/llamapy/events (one snapshot a second while this page is open).
"use strict";

import { bars, lines, stacked } from "./charts.js";
import { apiKey, errorMessage, events, headers, setApiKey } from "./sse.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
let model = params.get("model") ?? "";
const WINDOW_S = 60 * Math.min(60, Math.max(1, Number(params.get("minutes")) || 5));
const SOURCES = ["own", "donor", "inflight", "ram", "disk"];
const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();
const COLORS = () => Object.fromEntries(
  [...SOURCES, "computed", "decoding", "prefilling"].map((n) => [n, css("--" + n)]));
let samples = [];

// --- derived series ---------------------------------------------------------------------

/** Per-second rates between consecutive snapshots. */
export function rates(list) {
  const out = [];
  for (let i = 1; i < list.length; i++) {
    const a = list[i - 1], b = list[i];
    const dt = b.time - a.time;
    if (!(dt > 0) || !a.tokens || !b.tokens) continue;
    const per = (f) => Math.max(0, f(b) - f(a)) / dt;
    const values = { generated: per((s) => s.tokens.generated),
                     computed: per((s) => s.tokens.prefill) };
    for (const src of SOURCES) values[src] = per((s) => s.reused[src]);
    const n = b.ttft.count - a.ttft.count;
    if (n > 0) values.ttft = 1000 * (b.ttft.sum_s - a.ttft.sum_s) / n;
    out.push({ t: b.time, values });
  }
  return out;
}

function since(seconds) {
  const last = samples[samples.length - 1];
  const first = samples.find((s) => s.time >= last.time - seconds && s.tokens) ?? last;
  return [first, last];
}

// --- drawing -----------------------------------------------------------------------------

const fmtBytes = (n) => n >= 2 ** 30 ? (n / 2 ** 30).toFixed(2) + " GiB"
  : n >= 2 ** 20 ? (n / 2 ** 20).toFixed(1) + " MiB" : (n / 1024).toFixed(0) + " KiB";

function slotCard(slot) {
  const card = document.createElement("div");
  card.className = "slot";
  card.dataset.state = slot.state;
  card.dataset.id = String(slot.id);
  const prefill = slot.state === "prefilling" && slot.prompt_tokens > 0;
  const share = slot.other_tenant ? 0  // another tenant's slot: only its id and state
    : prefill ? (slot.num_computed_tokens ?? 0) / slot.prompt_tokens
    : slot.cached_tokens / Math.max(1, slot.n_ctx);
  card.innerHTML = '<div class="slot-head"><b></b><span class="slot-state"></span></div>' +
    '<div class="bar"><div class="fill"></div></div><div class="slot-meta"></div>';
  card.querySelector("b").textContent = "slot " + slot.id;
  card.querySelector(".slot-state").textContent = slot.state +
    (prefill ? " " + Math.round(100 * share) + "%" : "");
  card.querySelector(".fill").style.width = (100 * Math.min(1, share)).toFixed(1) + "%";
  const meta = [slot.other_tenant ? "another tenant's"
                                 : `${slot.cached_tokens} / ${slot.n_ctx} tokens resident`];
  if (slot.is_processing && !slot.other_tenant) meta.push(`prompt ${slot.prompt_tokens}, generated ${slot.generated_tokens}`);
  if (slot.cache_scope) meta.push("scope " + slot.cache_scope);
  if (slot.session) meta.push("session " + slot.session);
  if (slot.lease_id != null) meta.push("lease " + slot.lease_id);
  card.querySelector(".slot-meta").textContent = meta.join(" · ");
  return card;
}

function tile(id, value) { $(id).textContent = value; }

function drawTiles(snap, series) {
  const [a, b] = since(60);
  const n = b.ttft.count - a.ttft.count;
  const recent = series.slice(-5);
  const tps = recent.length ? recent.reduce((s, p) => s + p.values.generated, 0) / recent.length
                            : 0;
  tile("queue-depth", String(snap.queue_depth));
  tile("tok-s", tps.toFixed(1));
  tile("ttft", n > 0 ? Math.round(1000 * (b.ttft.sum_s - a.ttft.sum_s) / n) + " ms" : "–");
  tile("finished", String(snap.requests.finished));
  const busy = snap.slots.filter((s) => s.state !== "idle").length;
  tile("busy", `${busy} / ${snap.slots.length}`);
}

function meter(id, used, budget) {
  const box = $(id);
  box.querySelector(".fill").style.width = budget > 0
    ? (100 * Math.min(1, used / budget)).toFixed(1) + "%" : "0%";
  box.querySelector(".meter-text").textContent = budget > 0
    ? `${fmtBytes(used)} of ${fmtBytes(budget)}` : "off";
}

function drawCaches(snap) {
  // a tenant key's view has no cache or event sections: they are the whole server's
  $("caches").hidden = !snap.ram_cache;
  if (!snap.ram_cache) return;
  meter("ram-meter", snap.ram_cache.bytes, snap.ram_cache.budget_bytes);
  meter("disk-meter", snap.disk_cache.bytes, snap.disk_cache.budget_bytes);
  tile("ram-detail", `${snap.ram_cache.entries} entries · ${snap.ram_cache.evictions} evictions` +
       ` · ${snap.ram_cache.restores} restores`);
  tile("disk-detail", `${snap.disk_cache.entries} files · ${snap.disk_cache.evictions} evictions` +
       ` · ${snap.disk_cache.restores} restores · ${snap.disk_cache.writes} writes`);
  tile("instability", String(snap.events.instability));
  tile("kv-pressure", `${snap.events.kv_pressure} (${snap.events.purged_slots} slots purged)`);
  $("instability-list").replaceChildren(...snap.recent_instability.slice().reverse().map((e) => {
    const li = document.createElement("li");
    li.textContent = `slot ${e.slot_id}: matched ${e.matched_tokens} of ${e.cached_tokens}` +
      ` cached tokens (prompt ${e.prompt_tokens})`;
    return li;
  }));
}

function drawCharts(series) {
  const colors = { ...COLORS(), generated: css("--decoding"), ttft: css("--accent") };
  const sums = stacked($("reuse-chart"), series, ["computed", ...SOURCES], colors,
                       { windowS: WINDOW_S, unit: "tokens/s" });
  const reused = SOURCES.reduce((s, n) => s + sums[n], 0);
  $("reuse-chart").dataset.reused = String(Math.round(reused));
  for (const src of SOURCES) tile("legend-" + src, String(Math.round(sums[src])));
  tile("legend-computed", String(Math.round(sums.computed)));
  lines($("tps-chart"), series, ["generated"], colors, { windowS: WINDOW_S, unit: "tok/s" });
  bars($("ttft-chart"), series, "ttft", colors.ttft, { windowS: WINDOW_S, unit: "ms" });
}

function drawModels(snap) {
  const picker = $("model-picker");
  if (!snap.models) { picker.hidden = true; return; }
  picker.hidden = false;
  if (picker.options.length !== snap.models.length) {
    picker.replaceChildren(...snap.models.map((m) => new Option(m.id, m.id)));
  }
  for (const [i, m] of snap.models.entries()) picker.options[i].text = `${m.id} (${m.state})`;
  picker.value = snap.model;
}

function draw(snap) {
  $("model").textContent = "model: " + snap.model + (snap.state === "ready" ? "" : " — " + snap.state)
    + (snap.view === "tenant" ? " · counting your tenant's requests" : "");
  $("watchers").textContent = snap.watchers + (snap.watchers === 1 ? " viewer" : " viewers");
  drawModels(snap);
  $("slots").replaceChildren(...snap.slots.map(slotCard));
  document.body.dataset.snapshots = String(samples.length);
  if (!snap.tokens) return;
  const series = rates(samples);
  drawTiles(snap, series);
  drawCaches(snap);
  drawCharts(series);
}

// --- the feed ----------------------------------------------------------------------------

function status(text, ok) {
  $("conn").textContent = text;
  $("conn").className = ok ? "conn ok" : "conn";
}

async function follow(signal) {
  const query = model ? "?model=" + encodeURIComponent(model) : "";
  const r = await fetch("v1/llamapy/events" + query, { headers: headers(), signal });
  if (!r.ok) {
    $("auth").hidden = r.status !== 401;
    throw new Error(await errorMessage(r));
  }
  $("auth").hidden = true;
  status("live", true);
  for await (const snap of events(r)) {
    samples.push(snap);
    samples = samples.filter((s) => s.time >= snap.time - WINDOW_S - 2);
    draw(snap);
  }
}

let feed = null;

async function connect() {
  feed?.abort();
  const controller = feed = new AbortController();
  for (let wait = 1000; !controller.signal.aborted; wait = Math.min(wait * 2, 10000)) {
    try { await follow(controller.signal); wait = 500; } catch (e) {
      if (controller.signal.aborted) return;
      status("disconnected: " + e.message, false);
    }
    await new Promise((resolve) => setTimeout(resolve, wait));
    if (!controller.signal.aborted) status("reconnecting…", false);
  }
}

$("model-picker").addEventListener("change", () => {
  model = $("model-picker").value;
  samples = [];
  params.set("model", model);
  history.replaceState(null, "", "?" + params);
  connect();
});
$("api-key").value = apiKey();
$("api-key").addEventListener("change", () => { setApiKey($("api-key").value.trim()); connect(); });
connect();
