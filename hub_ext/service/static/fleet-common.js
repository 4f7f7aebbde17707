/*
 * The Fleet home's shared parts: its settings (from the page), the API call, element helpers,
 * notices, formatting, and the page's state. Everything shown from the API is set as text.
 */
const data = document.body.dataset;
export const CFG = {
  user: data.user,
  prefix: data.prefix,
  hub: data.hub,
  xsrf: data.xsrf,
  console: data.console === "1",
};
export const API = `${CFG.prefix}api`;
export const PAGINATION = "application/jupyterhub-pagination+json";
export const FINAL = ["TERMINATED", "ERROR", "CANCELLED"];
export const SETTLING = ["PENDING", "SCHEDULED", "PREPARING", "STARTING", "TERMINATING"];
export const RECENT_KEY = `labfleet-fleethome-recent:${CFG.user}`;
export const ENDED_SHOWN = 5;

// ------------------------------------------------------------ helpers

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export async function api(path, { method = "GET", json, body, accept, text = false } = {}) {
  // Every request, GETs too: the Hub's cookie login checks it for any fetch() but a page view.
  const headers = { "X-XSRFToken": CFG.xsrf };
  if (accept) {
    headers.Accept = accept;
  }
  let payload = body;
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(json);
  }
  const r = await fetch(API + path, {
    method,
    headers,
    body: payload,
    credentials: "same-origin",
    cache: "no-store",
  });
  if (!r.ok) {
    let message = `${r.status} ${r.statusText}`;
    try {
      const e = await r.json();
      if (e && typeof e.message === "string") {
        message = e.message;
      }
    } catch (_) {
      // not JSON: the status says it
    }
    throw new ApiError(r.status, message);
  }
  if (text) {
    return r.text();
  }
  return r.status === 204 ? null : r.json();
}

/** An element with attributes (class, text, on<event>, data-*, the rest as attributes) and children. */
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) {
      continue;
    }
    if (k === "class") {
      e.className = v;
    } else if (k === "text") {
      e.textContent = v;
    } else if (k.startsWith("on") && typeof v === "function") {
      e.addEventListener(k.slice(2), v);
    } else {
      e.setAttribute(k, v === true ? "" : String(v));
    }
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined && c !== false) {
      e.append(c instanceof Node ? c : String(c));
    }
  }
  return e;
}

export const $ = id => document.getElementById(id);

export function button(label, onclick, cls = "btn btn-sm btn-outline-secondary", attrs = {}) {
  return el("button", { type: "button", class: cls, onclick, ...attrs }, label);
}

/** A button that asks for a second click before it acts (no browser dialog). */
export function confirmButton(label, confirmLabel, action, attrs = {}) {
  const b = button(label, null, "btn btn-sm btn-outline-danger", attrs);
  let armed = null;
  b.addEventListener("click", async () => {
    if (!armed) {
      b.textContent = confirmLabel;
      b.classList.replace("btn-outline-danger", "btn-danger");
      armed = setTimeout(() => {
        armed = null;
        b.textContent = label;
        b.classList.replace("btn-danger", "btn-outline-danger");
      }, 5000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    b.disabled = true;
    try {
      await action();
    } finally {
      b.disabled = false;
    }
  });
  return b;
}

export function show(node, visible) {
  node.hidden = !visible;
}

let noticeTimer = null;
export function notify(message, kind = "danger") {
  const box = $("lf-error");
  box.className = `alert alert-${kind}`;
  box.dataset.kind = kind;
  box.textContent = message;
  box.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => (box.hidden = true), kind === "danger" ? 15000 : 6000);
}

/** Run ``fn``; a refusal shows as a notice (and a lost login asks for a reload). */
export async function attempt(fn, what) {
  try {
    return await fn();
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      notify("Your login to the Fleet ran out: reload the page to log in again.");
    } else {
      notify(`${what}: ${e.message}`);
    }
    return undefined;
  }
}

export function formatBytes(n) {
  if (n === null || n === undefined || Number.isNaN(Number(n))) {
    return "–";
  }
  let v = Number(n);
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${i === 0 ? v : v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

export function formatNumber(n, digits = 2) {
  const v = Number(n);
  return Number.isInteger(v) ? String(v) : String(Number(v.toFixed(digits)));
}

export function slotText(slots) {
  const parts = [];
  const s = slots || {};
  for (const [name, value] of Object.entries(s)) {
    const base = name.split(":")[0];
    if (base === "cpu") {
      parts.push(`${formatNumber(value, 3)} CPU`);
    } else if (base === "mem") {
      parts.push(`${formatBytes(value)} memory`);
    } else if (base === "gpu") {
      parts.push(`${formatNumber(value)} GPU${Number(value) === 1 ? "" : "s"}`);
    } else if (base === "gpu.shares" && !("gpu" in s)) {
      parts.push(`${formatNumber(value)} of a GPU`);
    }
  }
  return parts.length ? parts.join(" · ") : "the defaults";
}

export function gpuText(session) {
  const devices = session.devices || [];
  if (!devices.length) {
    const shares = (session.slots || {})["gpu.shares"];
    return shares ? `${formatNumber(shares)} of a GPU (not placed yet)` : "no GPU";
  }
  return devices
    .map(d => `${formatNumber(d.shares)} of GPU ${d.index} (${d.model})`)
    .join(", ");
}


export function userPath(name) {
  // as the Hub spells a user's URL (its escape with '@' and '~' kept)
  return encodeURIComponent(name).replace(/%40/g, "@").replace(/%7E/gi, "~");
}

export function filePath(path) {
  return path
    .split("/")
    .filter(Boolean)
    .map(encodeURIComponent)
    .join("/");
}

export function statusBadge(status) {
  const cls =
    status === "RUNNING"
      ? "text-bg-success"
      : status === "PENDING"
        ? "text-bg-warning"
        : FINAL.includes(status)
          ? "text-bg-secondary"
          : "text-bg-info";
  return el("span", { class: `badge lf-status ${cls}`, "data-testid": "lf-session-status" }, status);
}

export const state = {
  me: null,
  options: null,
  sessions: [],
  choice: null,
  folders: [],
  browse: null, // {folder, path}
  fastUntil: 0, // poll the sessions every 2 s until then
};
