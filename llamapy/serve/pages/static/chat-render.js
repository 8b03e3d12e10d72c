// How a message looks: Markdown through marked, sanitised by DOMPurify (never raw model HTML),
// code blocks highlighted with a copy button, reasoning in a collapsible block, tool calls as
// structured blocks, and the answer's stats line. Uses the vendored globals marked, DOMPurify
// and hljs (see vendor/README).
"use strict";

/* global marked, DOMPurify, hljs */

const PURIFY = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: ["img", "style", "form", "input", "button", "textarea", "select", "video",
                "audio", "iframe"],
  FORBID_ATTR: ["style"],
};

const escapeHtml = (text) => text.replace(/[&<>"']/g, (c) => (
  { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

// Raw HTML the model writes is shown as text, not rendered (DOMPurify stays the safety net).
marked.use({ gfm: true, breaks: true,
             renderer: { html: (token) => escapeHtml(token.text ?? token.raw ?? "") } });
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});
hljs.configure({ ignoreUnescapedHTML: true });

/** Create an element with a class and (as text, never HTML) its content. */
export function el(tag, className = "", text = "") {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text) node.textContent = text;
  return node;
}

/** Copy `text` to the clipboard (falls back to a hidden textarea off secure contexts). */
export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
  } catch (e) {
    const area = el("textarea");
    area.value = text;
    document.body.appendChild(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
}

/** A button that copies `read()` and says so for a moment. */
export function copyButton(read, label = "copy") {
  const button = el("button", "copy", label);
  button.type = "button";
  button.addEventListener("click", async () => {
    await copyText(read());
    button.textContent = "copied";
    button.classList.add("done");
    setTimeout(() => { button.textContent = label; button.classList.remove("done"); }, 1500);
  });
  return button;
}

function decorateCode(code) {
  const pre = code.parentElement;
  const lang = (code.className.match(/language-([\w+#.-]+)/) ?? [])[1] ?? "";
  const text = code.textContent;
  const known = lang && hljs.getLanguage(lang);
  const result = known ? hljs.highlight(text, { language: lang, ignoreIllegals: true })
                       : hljs.highlightAuto(text);
  code.innerHTML = result.value;  // hljs escapes the text it highlights
  code.classList.add("hljs");
  const bar = el("div", "code-bar");
  bar.append(el("span", "code-lang", lang || result.language || "text"),
             copyButton(() => text));
  const wrap = el("div", "code-block");
  pre.replaceWith(wrap);
  wrap.append(bar, pre);
}

/** Render Markdown `text` into `target` (sanitised), code blocks highlighted. */
export function renderMarkdown(target, text) {
  target.innerHTML = DOMPurify.sanitize(marked.parse(text), PURIFY);
  for (const code of target.querySelectorAll("pre > code")) decorateCode(code);
}

/** Tool calls as blocks: the function's name, then its arguments (pretty JSON when valid). */
export function renderTools(target, calls) {
  target.replaceChildren(...calls.filter(Boolean).map((call) => {
    const block = el("div", "tool-call");
    let args = call.arguments ?? "";
    try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (e) { /* partial JSON */ }
    block.append(el("div", "tool-name", "→ " + (call.name || "tool")),
                 el("pre", "tool-args", args));
    return block;
  }));
}

/** A message's stats line: tokens, tok/s, TTFT, prompt tokens and where their KV came from. */
export function statsLine(stats) {
  if (!stats) return "";
  const parts = [stats.tokens + " tokens"];
  if (stats.tok_s) parts.push(stats.tok_s.toFixed(1) + " tok/s");
  if (stats.ttft_ms != null) parts.push("TTFT " + Math.round(stats.ttft_ms) + " ms");
  if (stats.prompt_tokens != null) {
    let prompt = "prompt " + stats.prompt_tokens;
    if (stats.cached_tokens) {
      prompt += " (" + stats.cached_tokens + " cached" +
        (stats.cache_source ? " from " + stats.cache_source : "") + ")";
    }
    parts.push(prompt);
  }
  if (stats.stopped) parts.push("stopped");
  return parts.join(" · ");
}

/** The skeleton of a message bubble (`.msg.ROLE`), its parts found by class. */
export function bubble(role) {
  const div = el("div", "msg " + role);
  const head = el("div", "msg-head");
  head.append(el("span", "role", role), el("span", "msg-actions"));
  div.append(head);
  if (role === "assistant") {
    const reasoning = el("details", "reasoning");
    reasoning.hidden = true;
    reasoning.append(el("summary", "", "reasoning"), el("div", "reasoning-text"));
    div.append(reasoning, el("div", "content markdown"), el("div", "tools"),
               el("div", "msg-stats"));
  } else {
    div.append(el("div", "content"));
  }
  return div;
}

/** Fill an assistant bubble from its message (content, reasoning, tool calls, stats). */
export function fillAssistant(div, msg) {
  renderMarkdown(div.querySelector(".content"), msg.content ?? "");
  const reasoning = div.querySelector(".reasoning");
  reasoning.hidden = !msg.reasoning;
  div.querySelector(".reasoning-text").textContent = msg.reasoning ?? "";
  renderTools(div.querySelector(".tools"), msg.tool_calls ?? []);
  div.querySelector(".msg-stats").textContent = statsLine(msg.stats);
  div.dataset.stopped = String(Boolean(msg.stats?.stopped));
  div.dataset.tokens = String(msg.stats?.tokens ?? 0);
}
