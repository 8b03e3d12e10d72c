// Conversations kept in the browser (localStorage): each with its messages, its own system
// prompt and sampling settings, and the model it talks to. Export/import as JSON.
"use strict";

const LIST_KEY = "llamapy.conversations";
const CURRENT_KEY = "llamapy.current";
const FORMAT = "llamapy.conversations.v1";

/** A new conversation's settings when there is none to inherit from. */
export const DEFAULT_SETTINGS = Object.freeze(
  { system: "", temperature: 0.7, max_tokens: 512, extra: "{}", model: "" });

const newId = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 8);

/** A fresh conversation (settings copied from `settings`, e.g. the current one's). */
export function createConversation(settings = DEFAULT_SETTINGS, title = "New chat") {
  const now = Date.now();
  return { id: newId(), title, created: now, updated: now,
           settings: { ...DEFAULT_SETTINGS, ...settings }, messages: [] };
}

function valid(conv) {
  return conv && typeof conv.id === "string" && typeof conv.title === "string"
    && Array.isArray(conv.messages)
    && conv.messages.every((m) => m && typeof m.role === "string"
                                  && typeof (m.content ?? "") === "string");
}

export class Store {
  constructor(storage = localStorage) {
    this.storage = storage;
    let list = [];
    try { list = JSON.parse(storage.getItem(LIST_KEY) ?? "[]"); } catch (e) { list = []; }
    this.items = new Map(list.filter(valid).map((c) => [c.id, c]));
  }

  /** Conversations, most recently updated first. */
  list() { return [...this.items.values()].sort((a, b) => b.updated - a.updated); }

  get(id) { return this.items.get(id); }

  get currentId() { return this.storage.getItem(CURRENT_KEY); }

  set currentId(id) { this.storage.setItem(CURRENT_KEY, id); }

  /** Save a conversation (new or changed) and mark it updated. */
  put(conv, touch = true) {
    if (touch) conv.updated = Date.now();
    this.items.set(conv.id, conv);
    this.flush();
  }

  remove(id) { this.items.delete(id); this.flush(); }

  /** Write every conversation back; a full storage is reported to `onError` (the page shows
   * it) instead of breaking the answer being saved. */
  flush() {
    try {
      this.storage.setItem(LIST_KEY, JSON.stringify([...this.items.values()]));
    } catch (e) {
      this.onError?.("could not save conversations (" + e.name + "): export and delete some");
    }
  }

  /** Every conversation as a JSON document (what `importJSON` reads back). */
  exportJSON() {
    return JSON.stringify({ format: FORMAT, exported: new Date().toISOString(),
                            conversations: this.list() }, null, 2);
  }

  /** Add the conversations of an exported document (or a bare list); an id already here gets
   * a new one, so an import never overwrites. Returns how many were added. */
  importJSON(text) {
    const doc = JSON.parse(text);
    const list = Array.isArray(doc) ? doc : doc?.conversations;
    if (!Array.isArray(list)) throw new Error("not a conversations export");
    let added = 0;
    for (const conv of list) {
      if (!valid(conv)) continue;
      const copy = { ...createConversation(conv.settings, conv.title), ...conv,
                     settings: { ...DEFAULT_SETTINGS, ...conv.settings } };
      if (this.items.has(copy.id)) copy.id = newId();
      this.items.set(copy.id, copy);
      added++;
    }
    this.flush();
    return added;
  }
}
