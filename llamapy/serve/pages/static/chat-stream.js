// One answer from /v1/chat/completions, streamed: deltas folded into the message as they come,
// the final chunk's usage and timings turned into the message's stats.
"use strict";

import { errorMessage, events, headers } from "./sse.js";

/** The request body of a conversation's next answer (its settings, its history). */
export function requestBody(conv) {
  const s = conv.settings;
  let extra;
  try { extra = JSON.parse(s.extra || "{}"); } catch (e) {
    throw new Error("extra request fields: " + e.message);
  }
  const messages = [];
  if (s.system.trim()) messages.push({ role: "system", content: s.system });
  for (const m of conv.messages) {
    if (m.role === "user" && m.images?.length) {  // data URLs, as the page attached them
      messages.push({ role: "user", content: [
        { type: "text", text: m.content ?? "" },
        ...m.images.map((url) => ({ type: "image_url", image_url: { url } }))] });
    } else if (m.role === "user" || m.role === "assistant") {
      messages.push({ role: m.role, content: m.content ?? "" });
    }
  }
  const body = { messages, stream: true, stream_options: { include_usage: true },
                 temperature: Number(s.temperature), max_tokens: Number(s.max_tokens) };
  if (s.model) body.model = s.model;
  return { ...body, ...extra };
}

/** Fold one chunk into `msg` (content, reasoning, tool calls) and `run` (usage, timings). */
function absorb(msg, run, chunk) {
  if (chunk.error) throw new Error(chunk.error.message ?? "stream error");
  if (chunk.usage) run.usage = chunk.usage;
  if (chunk.timings) run.timings = chunk.timings;
  const delta = chunk.choices?.[0]?.delta;
  if (!delta) return;
  if (delta.content || delta.reasoning_content) {
    run.first ??= performance.now();
    run.tokens++;
  }
  if (delta.reasoning_content) msg.reasoning = (msg.reasoning ?? "") + delta.reasoning_content;
  if (delta.content) msg.content += delta.content;
  for (const piece of delta.tool_calls ?? []) {
    const calls = (msg.tool_calls ??= []);
    calls[piece.index ?? 0] ??= { name: "", arguments: "" };
    const call = calls[piece.index ?? 0];
    if (piece.function?.name) call.name = piece.function.name;
    call.arguments += piece.function?.arguments ?? "";
  }
}

/** The stats of a finished (or stopped) run: the server's numbers when it sent them. */
export function runStats(run) {
  const t = run.timings ?? {};
  const u = run.usage ?? {};
  const now = performance.now();
  const tokens = u.completion_tokens ?? t.predicted_n ?? run.tokens;
  const seconds = (now - (run.first ?? run.started)) / 1000;
  const prompt = u.prompt_tokens ??
    (t.prompt_n != null ? t.prompt_n + (t.cache_n ?? 0) : null);
  return {
    tokens,
    tok_s: t.predicted_per_second ?? (seconds > 0 ? tokens / seconds : 0),
    ttft_ms: t.ttft_ms ?? (run.first != null ? run.first - run.started : null),
    prompt_tokens: prompt,
    cached_tokens: t.cache_n ?? u.prompt_tokens_details?.cached_tokens ?? null,
    cache_source: t.cache_source ?? null,
    stopped: Boolean(run.stopped),
  };
}

/** Stream the answer to `body` into `msg`, calling `update(run)` after each chunk; resolves
 * to the run (`run.stopped` when `signal` aborted it); a server error rejects with its
 * message. */
export async function streamAnswer(body, msg, signal, update) {
  const run = { started: performance.now(), first: null, tokens: 0, usage: null,
                timings: null, stopped: false };
  try {
    const r = await fetch("v1/chat/completions", { method: "POST", headers: headers(),
                                                     body: JSON.stringify(body), signal });
    if (!r.ok) throw new Error(await errorMessage(r));
    for await (const chunk of events(r)) {
      absorb(msg, run, chunk);
      update(run);
    }
  } catch (e) {
    if (e.name !== "AbortError") throw e;
    run.stopped = true;
  }
  return run;
}
