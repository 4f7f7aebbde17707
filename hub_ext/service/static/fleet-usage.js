/*
 * The Fleet home's usage (the last 30 days as an inline SVG plot, and the periods) and serving endpoints.
 */
import { $, api, attempt, button, el, formatNumber, statusBadge } from "./fleet-common.js";

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) {
    e.setAttribute(k, String(v));
  }
  if (text !== undefined) {
    e.textContent = text;
  }
  return e;
}

const KINDS = {
  gpu: { slot: "gpu.shares", per: "GPU", name: "GPU" },
  cpu: { slot: "cpu", per: "core", name: "CPU" },
};

function hours(figures, slot) {
  return Number((figures || {})[slot] || 0) / 3600;
}

// The unit a plot and its figures speak in, by the largest amount: a few seconds read as seconds,
// not as "0 hours" (as the console's usage chart does, widgets/usage.py).
const SCALES = [
  { below: 1 / 60, factor: 3600, word: "seconds" },
  { below: 1, factor: 60, word: "minutes" },
  { below: Infinity, factor: 1, word: "hours" },
];

function scaleFor(maxHours) {
  return SCALES.find(s => maxHours < s.below);
}

/** Bars of the last 30 days: hours allocated (light) with the hours used inside them (dark). */
function plot(daily, kind, scale) {
  const { slot } = KINDS[kind];
  const unit = `${KINDS[kind].per}-${scale.word}`;
  const W = 640;
  const H = 200;
  const left = 44;
  const bottom = 22;
  const top = 8;
  const values = daily.map(d => ({
    day: d.bucket,
    a: hours(d.allocated, slot) * scale.factor,
    u: hours(d.used, slot) * scale.factor,
  }));
  const max = Math.max(...values.map(v => Math.max(v.a, v.u)), 0);
  const ceiling = max > 0 ? niceCeiling(max) : 1;
  const plotW = W - left - 6;
  const plotH = H - top - bottom;
  const step = plotW / Math.max(values.length, 1);
  const root = svg("svg", {
    class: "lf-plot",
    viewBox: `0 0 ${W} ${H}`,
    role: "img",
    "aria-label": `${unit} per day, the last ${values.length} days`,
    "data-testid": "lf-usage-plot",
  });
  for (const frac of [0, 0.5, 1]) {
    const y = top + plotH * (1 - frac);
    root.append(svg("line", { class: "lf-axis", x1: left, x2: W - 6, y1: y, y2: y }));
    root.append(svg("text", { x: left - 4, y: y + 4, "text-anchor": "end" }, formatNumber(ceiling * frac, 2)));
  }
  values.forEach((v, i) => {
    const x = left + i * step + step * 0.15;
    const w = step * 0.7;
    const hA = (v.a / ceiling) * plotH;
    const hU = (Math.min(v.u, ceiling) / ceiling) * plotH;
    const title = `${v.day.slice(0, 10)}: ${formatNumber(v.a)} allocated, ${formatNumber(v.u)} used (${unit})`;
    if (hA > 0) {
      const bar = svg("rect", { class: "lf-bar-allocated", x, y: top + plotH - hA, width: w, height: hA });
      bar.append(svg("title", {}, title));
      root.append(bar);
    }
    if (hU > 0) {
      const bar = svg("rect", { class: "lf-bar-used", x: x + w * 0.2, y: top + plotH - hU, width: w * 0.6, height: hU });
      bar.append(svg("title", {}, title));
      root.append(bar);
    }
    if ((values.length - 1 - i) % 7 === 0) {
      // a week apart, ending today
      const d = new Date(v.day);
      const label = Number.isNaN(d.getTime()) ? v.day.slice(5, 10) : d.toLocaleDateString(undefined, { month: "short", day: "numeric" });
      const last = i === values.length - 1;
      root.append(svg("text", { x: last ? x + w : x + w / 2, y: H - 6, "text-anchor": last ? "end" : "middle" }, label));
    }
  });
  if (max === 0) {
    root.append(
      svg("text", { x: left + plotW / 2, y: top + plotH * 0.3, "text-anchor": "middle", class: "lf-plot-empty" }, `No ${KINDS[kind].name} use in these ${values.length} days`),
    );
  }
  return root;
}

function niceCeiling(v) {
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) {
    if (m * p >= v) {
      return m * p;
    }
  }
  return 10 * p;
}

let usageKind = null;
let usageData = null;

export async function loadUsage() {
  const u = await attempt(() => api("/usage/me"), "Your usage");
  if (!u) {
    return;
  }
  usageData = u;
  if (!usageKind) {
    const gpuUsed = (u.daily || []).some(d => hours(d.allocated, "gpu.shares") > 0);
    usageKind = gpuUsed ? "gpu" : "cpu";
  }
  renderUsage();
}

function renderUsage() {
  const u = usageData;
  const { slot } = KINDS[usageKind];
  // The plot's tallest day picks the unit; the periods below say their totals in the same one.
  const most = Math.max(0, ...(u.daily || []).map(d => Math.max(hours(d.allocated, slot), hours(d.used, slot))));
  const scale = scaleFor(most);
  const unit = `${KINDS[usageKind].per}-${scale.word}`;
  const amount = figures => formatNumber(hours(figures, slot) * scale.factor, 1);
  const toggle = el(
    "div",
    { class: "btn-group btn-group-sm mb-2", role: "group", "aria-label": "What to plot" },
    Object.entries(KINDS).map(([k, kind]) =>
      button(kind.name, () => {
        usageKind = k;
        renderUsage();
      }, `btn ${k === usageKind ? "btn-secondary" : "btn-outline-secondary"}`, { "aria-pressed": String(k === usageKind) }),
    ),
  );
  const periods = el(
    "div",
    { class: "lf-periods mt-2" },
    (u.periods || []).map(p =>
      el(
        "div",
        {},
        el("div", { class: "fw-semibold" }, p.label),
        el(
          "div",
          {},
          `${p.sessions} session${p.sessions === 1 ? "" : "s"} · ${amount(p.allocated)} ${unit}` +
            ` (${amount(p.used)} used)`,
        ),
      ),
    ),
  );
  const legend = el(
    "div",
    { class: "small text-body-secondary" },
    `${unit} per day:`,
    el("span", { class: "lf-legend lf-legend-allocated" }),
    "allocated",
    el("span", { class: "lf-legend lf-legend-used" }),
    "used",
  );
  $("lf-usage").replaceChildren(toggle, legend, plot(u.daily || [], usageKind, scale), periods);
}

// ------------------------------------------------------------ serving endpoints

export async function loadEndpoints() {
  let list;
  try {
    list = await api("/endpoints");
  } catch (e) {
    $("lf-endpoints").replaceChildren(el("p", { class: "text-body-secondary mb-0" }, `Endpoints: ${e.message}`));
    return;
  }
  const rows = Array.isArray(list) ? list : list.items || [];
  if (!rows.length) {
    $("lf-endpoints").replaceChildren(
      el(
        "p",
        { class: "text-body-secondary mb-0" },
        "No serving endpoints. Serve a model from the Fleet sidebar in JupyterLab or through the API.",
      ),
    );
    return;
  }
  $("lf-endpoints").replaceChildren(
    el(
      "table",
      { class: "table table-sm lf-table mb-0" },
      el("thead", {}, el("tr", {}, ["Name", "Status", "Replicas", ""].map(h => el("th", { scope: "col" }, h)))),
      el(
        "tbody",
        {},
        rows.map(e =>
          el(
            "tr",
            { "data-testid": "lf-endpoint" },
            el("td", {}, e.name, el("div", { class: "lf-why" }, e.project)),
            el("td", {}, statusBadge(e.status), e.status_reason ? el("div", { class: "lf-why" }, e.status_reason) : null),
            el("td", {}, `${e.healthy_replicas}/${e.replicas}`),
            el(
              "td",
              { class: "lf-actions" },
              typeof e.url === "string" && e.url.startsWith("/") ? el("a", { href: e.url }, "URL") : null,
            ),
          ),
        ),
      ),
    ),
  );
}
