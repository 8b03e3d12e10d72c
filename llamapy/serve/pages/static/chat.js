// The chat page: conversations kept in this browser, each with its settings; answers streamed
// as Markdown; stop, regenerate, edit-and-branch, per-message stats; the model picker.
"use strict";

import { bubble, copyButton, el, fillAssistant } from "./chat-render.js";
import { exportFile, importFile, renderList } from "./chat-list.js";
import { createConversation, Store } from "./chat-store.js";
import { requestBody, runStats, streamAnswer } from "./chat-stream.js";
import { apiKey, errorMessage, headers, setApiKey } from "./sse.js";

const $ = (id) => document.getElementById(id);
const store = new Store();
const SETTINGS = { system: "system", temperature: "temperature", max_tokens: "max-tokens",
                   extra: "extra" };
let conv = null;
let controller = null;

// --- conversations ----------------------------------------------------------------------

function open(id) {
  if (controller) return;
  conv = store.get(id) ?? newConversation();
  store.currentId = conv.id;
  for (const [key, input] of Object.entries(SETTINGS)) $(input).value = conv.settings[key];
  $("extra").classList.remove("invalid");
  syncModel();
  renderMessages();
  refreshList();
}

function newConversation(settings = conv?.settings) {
  const fresh = createConversation(settings);
  store.put(fresh);
  return fresh;
}

function refreshList() {
  renderList($("conversations"), store, conv?.id, {
    open,
    rename: (id, title) => { const c = store.get(id); c.title = title; store.put(c, false);
                             refreshList(); },
    remove: (id) => { store.remove(id);
                      if (conv.id === id) open(store.list()[0]?.id ?? newConversation().id);
                      else refreshList(); },
  });
}

/** A new conversation holding `conv`'s messages before `index`, plus `extra` messages. */
function branch(index, extra = [], suffix = " ⎇") {
  const copy = createConversation(conv.settings, conv.title + suffix);
  copy.parent = conv.id;
  copy.messages = structuredClone(conv.messages.slice(0, index)).concat(extra);
  store.put(copy);
  open(copy.id);
}

// --- messages ---------------------------------------------------------------------------

function renderMessages() {
  $("messages").replaceChildren(...conv.messages.map((msg, i) => messageView(msg, i)));
  $("empty").hidden = conv.messages.length > 0;
  $("stats").textContent = "";
}

function messageView(msg, index) {
  const div = bubble(msg.role);
  div.dataset.index = String(index);
  if (msg.role === "assistant") fillAssistant(div, msg);
  else div.querySelector(".content").textContent = msg.content;
  if (msg.images?.length) div.querySelector(".content").prepend(thumbnails(msg.images));
  div.dataset.done = "true";
  div.querySelector(".msg-actions").append(...actions(msg, index, div));
  return div;
}

function action(label, title, click) {
  const button = el("button", "act act-" + label, label);
  button.type = "button";
  button.title = title;
  button.addEventListener("click", () => { if (!controller) click(); });
  return button;
}

function actions(msg, index, div) {
  const out = [copyButton(() => msg.content)];
  if (msg.role === "user") out.push(action("edit", "edit and branch from here",
                                           () => startEdit(div, msg, index)));
  if (msg.role === "assistant" && index === conv.messages.length - 1) {
    out.push(action("regenerate", "answer again", () => {
      conv.messages.splice(index);
      renderMessages();
      generate();
    }));
  }
  out.push(action("branch", "new conversation up to here", () => branch(index + 1)));
  return out;
}

function startEdit(div, msg, index) {
  const area = el("textarea", "edit-box");
  area.value = msg.content;
  const save = action("send", "branch with the edited message and answer it", () => {
    const text = area.value.trim();
    if (!text) return;
    const edited = { role: "user", content: text };
    if (msg.images?.length) edited.images = msg.images;  // the images stay with the text
    branch(index, [edited], " (edited)");
    generate();
  });
  const cancel = action("cancel", "keep the message", () => renderMessages());
  const content = div.querySelector(".content");
  content.replaceChildren(area, el("div", "edit-actions"));
  content.lastChild.append(save, cancel);
  area.focus();
}

function showError(message) {
  const div = el("div", "msg error");
  div.append(el("div", "error-text", message));
  div.append(action("retry", "send the conversation again", () => { div.remove(); generate(); }));
  $("messages").appendChild(div);
  div.scrollIntoView({ block: "end" });
}

// --- answering ----------------------------------------------------------------------------

function busy(on) {
  $("send").disabled = on;
  $("stop").disabled = !on;
  document.body.classList.toggle("busy", on);
}

function headerStats(stats) {
  $("stats").textContent = stats.tokens + " tokens, " + stats.tok_s.toFixed(1) + " tokens/s";
}

function answerBubble(target) {
  const msg = { role: "assistant", content: "", reasoning: "", tool_calls: [], stats: null };
  target.messages.push(msg);
  const div = bubble("assistant");
  div.dataset.index = String(target.messages.length - 1);
  div.dataset.done = "false";
  $("messages").appendChild(div);
  $("empty").hidden = true;
  return { msg, div };
}

async function generate() {
  const target = conv;
  let body;
  try { body = requestBody(target); } catch (e) { showError(e.message); return; }
  const { msg, div } = answerBubble(target);
  controller = new AbortController();
  busy(true);
  let frame = 0;
  const paint = (run) => {
    msg.stats = { ...runStats(run), stopped: false };
    fillAssistant(div, msg);
    headerStats(msg.stats);
    div.scrollIntoView({ block: "end" });
  };
  try {
    const run = await streamAnswer(body, msg, controller.signal, (r) => {
      if (!frame) frame = requestAnimationFrame(() => { frame = 0; paint(r); });
    });
    cancelAnimationFrame(frame);
    msg.stats = runStats(run);
    finish(target, div, msg);
  } catch (e) {
    cancelAnimationFrame(frame);
    failed(target, div, msg, e);
  } finally {
    controller = null;
    busy(false);
    store.put(target);
    div.dataset.done = "true";
  }
}

function failed(target, div, msg, error) {  // a partial answer stays, marked stopped
  if (msg.content || msg.reasoning || msg.tool_calls.length) {
    msg.stats = { tokens: 0, tok_s: 0, ...msg.stats, stopped: true };
    finish(target, div, msg);
  } else {
    target.messages.pop();
    div.remove();
  }
  showError(String(error.message ?? error));
}

function finish(target, div, msg) {
  if (target === conv) renderMessages();  // the actions move to the latest answer
  else fillAssistant(div, msg);
  headerStats(msg.stats);
}

// --- attached images ----------------------------------------------------------------------

let attached = [];  // data URLs of the images the next message sends

function thumbnails(urls) {
  const strip = el("div", "thumbs");
  for (const url of urls) {
    const img = document.createElement("img");
    img.src = url;  // a data: URL the page read from a file (no remote fetch)
    img.alt = "attached image";
    strip.append(img);
  }
  return strip;
}

function showAttached() {
  $("attachments").replaceChildren(...(attached.length ? [thumbnails(attached)] : []));
  $("attachments").hidden = attached.length === 0;
}

function readImage(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function attach(files) {
  try { attached = attached.concat(await Promise.all([...files].map(readImage))); } catch (e) {
    showError("attach: " + e.message);
  }
  showAttached();
}

function send(text) {
  if (conv.title === "New chat") conv.title = text.slice(0, 48);
  const msg = { role: "user", content: text };
  if (attached.length) { msg.images = attached; attached = []; showAttached(); }
  conv.messages.push(msg);
  $("messages").appendChild(messageView(msg, conv.messages.length - 1));
  refreshList();
  generate();
}

// --- models and settings -----------------------------------------------------------------

let models = [];

async function loadModels() {
  try {
    const r = await fetch("v1/models", { headers: headers() });
    if (!r.ok) { $("model").textContent = "model: " + await errorMessage(r); return; }
    const listing = await r.json();
    models = listing.data.map((m) => m.id);
    // images: when the one model served has a projector (llama-server's capabilities)
    $("attach-label").hidden = !listing.models?.[0]?.capabilities?.includes("multimodal");
  } catch (e) { $("model").textContent = "model: unavailable"; return; }
  const picker = $("model-picker");
  picker.replaceChildren(...models.map((id) => { const o = el("option", "", id); o.value = id;
                                                 return o; }));
  picker.hidden = models.length < 2;
  syncModel();
}

function syncModel() {
  if (!conv || !models.length) return;
  if (!models.includes(conv.settings.model)) conv.settings.model = models.length > 1
    ? models[0] : "";
  $("model-picker").value = conv.settings.model || models[0];
  $("model").textContent = "model: " + (conv.settings.model || models[0]);
}

function bindSettings() {
  for (const [key, id] of Object.entries(SETTINGS)) {
    $(id).addEventListener("change", () => {
      const value = $(id).value;
      if (key === "extra") {
        try { JSON.parse(value || "{}"); $(id).classList.remove("invalid"); } catch (e) {
          $(id).classList.add("invalid");
        }
      }
      conv.settings[key] = value;
      store.put(conv, false);
    });
  }
  $("model-picker").addEventListener("change", () => {
    conv.settings.model = $("model-picker").value;
    store.put(conv, false);
    syncModel();
  });
  $("api-key").value = apiKey();
  $("api-key").addEventListener("change", () => { setApiKey($("api-key").value.trim());
                                                  loadModels(); });
}

function bindControls() {
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("input").value.trim();
    if (!text || controller) return;
    $("input").value = "";
    send(text);
  });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
  });
  $("stop").addEventListener("click", () => controller?.abort());
  $("attach").addEventListener("change", async () => {
    await attach($("attach").files);
    $("attach").value = "";
  });
  $("clear").addEventListener("click", () => {
    if (controller) return;
    open(conv.messages.length ? newConversation().id : conv.id);
    $("input").focus();
  });
  $("toggle-settings").addEventListener("click", () => {
    $("settings").hidden = !$("settings").hidden;
  });
  $("toggle-sidebar").addEventListener("click", () => document.body.classList.toggle("show-sidebar"));
  $("main").addEventListener("click", (e) => {  // narrow screens: a click beside it closes it
    if (!e.target.closest("#toggle-sidebar")) document.body.classList.remove("show-sidebar");
  });
  $("conversations").addEventListener("click", (e) => {
    if (e.target.closest(".conv-open")) document.body.classList.remove("show-sidebar");
  });
  $("export").addEventListener("click", () => exportFile(store));
  $("import").addEventListener("change", async () => {
    const file = $("import").files[0];
    if (!file) return;
    try { await importFile(store, file); refreshList(); } catch (e) {
      showError("import: " + e.message);
    }
    $("import").value = "";
  });
}

store.onError = showError;
bindSettings();
bindControls();
open(store.currentId ?? store.list()[0]?.id);
loadModels();
