// Server-sent events over fetch(): EventSource cannot send an Authorization header, so both
// pages read their streams (chat answers, the live view's feed) with this one parser.
"use strict";

const KEY = "llamapy.api-key";

/** The API key of this tab (session storage only: gone when the tab closes). */
export function apiKey() { return sessionStorage.getItem(KEY) ?? ""; }

/** Keep (or, empty, forget) the API key for this tab. */
export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY, key); else sessionStorage.removeItem(KEY);
}

/** Request headers: JSON, plus the bearer key when one is set. */
export function headers() {
  const h = { "Content-Type": "application/json" };
  const key = apiKey().trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

/** The server's error message of a failed response (its JSON `error.message`, else status). */
export async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error?.message ?? body.detail ?? ("HTTP " + response.status);
  } catch (e) {
    return "HTTP " + response.status + " " + response.statusText;
  }
}

/** The parsed `data:` events of an SSE response body, until `[DONE]` or its end. */
export async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") return;
          yield JSON.parse(data);
        }
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}
