// Small SVG charts for the live view: stacked areas and lines over a sliding time window.
// Points are {t, values: {name: number}}; the x axis is the last `windowS` seconds.
"use strict";

const NS = "http://www.w3.org/2000/svg";
const W = 600, H = 150, PAD = 4;

function node(tag, attrs = {}, text = "") {
  const n = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, String(v));
  if (text) n.textContent = text;
  return n;
}

/** A tidy upper bound for an axis (1, 2 or 5 times a power of ten). */
export function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 5, 10].map((m) => m * power).find((m) => m >= value);
}

function scales(points, windowS, max) {
  const now = points.length ? points[points.length - 1].t : Date.now() / 1000;
  return {
    x: (t) => PAD + (W - 2 * PAD) * (1 - (now - t) / windowS),
    y: (v) => H - PAD - (H - 2 * PAD) * (v / max),
  };
}

function frame(svg, max, unit, windowS) {
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.replaceChildren(
    node("line", { x1: 0, y1: H - PAD, x2: W, y2: H - PAD, class: "axis" }),
    node("line", { x1: 0, y1: PAD, x2: W, y2: PAD, class: "grid" }),
    node("line", { x1: 0, y1: H / 2, x2: W, y2: H / 2, class: "grid" }));
  const caption = svg.parentElement.querySelector(".chart-scale");
  if (caption) caption.textContent = `max ${max} ${unit} · last ${Math.round(windowS / 60)} min`;
}

/** Draw `names` stacked (first at the bottom) with `colors`; returns each name's sum. */
export function stacked(svg, points, names, colors, { windowS = 300, unit = "" } = {}) {
  const tops = points.map((p) => names.reduce((s, n) => s + (p.values[n] ?? 0), 0));
  const max = niceMax(Math.max(0, ...tops));
  frame(svg, max, unit, windowS);
  const { x, y } = scales(points, windowS, max);
  const base = points.map(() => 0);
  const sums = {};
  for (const name of names) {
    const top = points.map((p, i) => base[i] + (p.values[name] ?? 0));
    sums[name] = points.reduce((s, p) => s + (p.values[name] ?? 0), 0);
    if (points.length > 1 && sums[name] > 0) {
      const upper = points.map((p, i) => `${x(p.t)},${y(top[i])}`);
      const lower = points.map((p, i) => `${x(p.t)},${y(base[i])}`).reverse();
      svg.append(node("polygon", { points: upper.concat(lower).join(" "),
                                   fill: colors[name], class: "area", "data-series": name }));
    }
    top.forEach((v, i) => { base[i] = v; });
  }
  return sums;
}

/** Draw each of `names` as a line (gaps where a point lacks the value). */
export function lines(svg, points, names, colors, { windowS = 300, unit = "" } = {}) {
  const all = points.flatMap((p) => names.map((n) => p.values[n]).filter((v) => v != null));
  const max = niceMax(Math.max(0, ...all));
  frame(svg, max, unit, windowS);
  const { x, y } = scales(points, windowS, max);
  for (const name of names) {
    const have = points.filter((p) => p.values[name] != null);
    if (!have.length) continue;
    const d = have.map((p) => `${x(p.t)},${y(p.values[name])}`).join(" ");
    svg.append(node("polyline", { points: d, stroke: colors[name], class: "line",
                                  "data-series": name }));
  }
}

/** Draw `name` as one bar per point (values that come now and then, such as TTFT). */
export function bars(svg, points, name, color, { windowS = 300, unit = "" } = {}) {
  const have = points.filter((p) => p.values[name] != null);
  const max = niceMax(Math.max(0, ...have.map((p) => p.values[name])));
  frame(svg, max, unit, windowS);
  const { x, y } = scales(points, windowS, max);
  const width = Math.max(3, (W - 2 * PAD) / windowS);
  for (const p of have) {
    const top = y(p.values[name]);
    svg.append(node("rect", { x: x(p.t) - width, y: top, width, height: H - PAD - top,
                              fill: color, class: "bar-mark", "data-series": name }));
  }
}
