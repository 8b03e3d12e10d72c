// The sidebar: the conversations kept in this browser (open, rename, delete), export/import.
"use strict";

import { el } from "./chat-render.js";

/** Draw the list of `store`'s conversations, `currentId` marked; `on` has the actions:
 * open(id), rename(id, title), remove(id). */
export function renderList(target, store, currentId, on) {
  target.replaceChildren(...store.list().map((conv) => {
    const item = el("li", "conv");
    item.dataset.id = conv.id;
    if (conv.id === currentId) item.setAttribute("aria-current", "true");
    const open = el("button", "conv-open", conv.title || "untitled");
    open.type = "button";
    open.title = conv.title;
    open.addEventListener("click", () => on.open(conv.id));
    const rename = iconButton("conv-rename", "✎", "rename",
                              () => startRename(item, open, conv, on.rename));
    const remove = iconButton("conv-delete", "×", "delete", () => {
      if (confirm(`Delete "${conv.title}"?`)) on.remove(conv.id);
    });
    item.append(open, rename, remove);
    return item;
  }));
}

function iconButton(className, text, title, click) {
  const button = el("button", "icon " + className, text);
  button.type = "button";
  button.title = title;
  button.setAttribute("aria-label", title);
  button.addEventListener("click", click);
  return button;
}

function startRename(item, open, conv, rename) {
  const input = el("input", "conv-title");
  input.value = conv.title;
  open.replaceWith(input);
  input.focus();
  input.select();
  let finished = false;
  const finish = (keep) => {
    if (finished) return;
    finished = true;
    rename(conv.id, keep && input.value.trim() ? input.value.trim() : conv.title);
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") finish(true);
    if (e.key === "Escape") finish(false);
  });
  input.addEventListener("blur", () => finish(true));
}

/** Offer the store's conversations as a JSON download. */
export function exportFile(store) {
  const blob = new Blob([store.exportJSON()], { type: "application/json" });
  const link = el("a");
  link.href = URL.createObjectURL(blob);
  link.download = "llamapy-conversations-" + new Date().toISOString().slice(0, 10) + ".json";
  document.body.appendChild(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}

/** Import the conversations of a chosen file; resolves to how many were added. */
export async function importFile(store, file) {
  return store.importJSON(await file.text());
}
