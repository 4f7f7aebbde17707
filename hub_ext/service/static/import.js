/*
 * Import & Run (templates/import.html): a link's URL into a folder of the user's, then a session that
 * mounts the folder opens what was imported.
 *
 * 1. POST /api/imports with the link's query (url, folder, branch, open, project, image, gpu,
 *    resource_group), then poll the import: fetch, write (or re-sync, with its report);
 * 2. a running session of the user's that mounts the folder, else a new one (POST /api/sessions:
 *    the ordinary admission, so quotas and the queue apply and a waiting session says why);
 * 3. open the file or folder in that session's JupyterLab (after a re-sync, once its report is read:
 *    the Open button).
 * Everything shown from the API is set as text.
 */
import { $, ApiError, CFG, FINAL, PAGINATION, api, el, filePath, show, slotText, userPath } from "./fleet-common.js";

const FIELDS = ["url", "folder", "branch", "open", "project", "image", "gpu", "resource_group"];
const LIVE = ["PENDING", "SCHEDULED", "PREPARING", "STARTING", "RUNNING"];
const POLL_MS = 700;
const SESSION_WAIT_MS = 10 * 60 * 1000;

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

function step(name, text, kind = "secondary") {
  const badge = document.querySelector(`[data-testid="lf-step-${name}"]`);
  badge.textContent = text;
  badge.className = `ms-2 small badge text-bg-${kind}`;
  badge.dataset.kind = kind;
}

function message(text, kind) {
  const box = $("lf-import-message");
  box.className = `alert alert-${kind} mb-3`;
  box.dataset.kind = kind;
  box.textContent = text;
  box.hidden = false;
}

function fail(stepName, text) {
  step(stepName, "stopped", "danger");
  message(text, "danger");
  show($("lf-import-form"), true);
}

/** The link's import request, from the page's query. */
function requestOf(params) {
  const body = {};
  for (const name of FIELDS) {
    const value = params.get(name);
    if (value !== null && value !== "") {
      body[name] = name === "gpu" ? Number(value) : value;
    }
  }
  return body;
}

function showReport(report) {
  const lines = [
    ["Updated from the source", report.updated || []],
    ["Yours, kept", report.kept || []],
    ["Renamed out of the way", report.renamed || []],
  ].filter(([, items]) => items.length);
  if (!lines.length) {
    return;
  }
  $("lf-import-report-body").replaceChildren(
    ...lines.map(([title, items]) =>
      el(
        "div",
        { class: "mt-2" },
        el("strong", {}, `${title} (${items.length})`),
        el("ul", { class: "mb-0" }, ...items.slice(0, 50).map(item => el("li", { class: "text-break" }, item))),
      ),
    ),
  );
  show($("lf-import-report"), true);
}

async function runImport(body) {
  step("fetch", "running…", "info");
  let job = await api("/imports", { method: "POST", json: body });
  while (job.status === "fetching" || job.status === "writing") {
    if (job.status === "writing") {
      step("fetch", "done", "success");
      step("write", job.resync ? "updating…" : "running…", "info");
    }
    await sleep(POLL_MS);
    job = await api(`/imports/${encodeURIComponent(job.id)}`);
  }
  if (job.status === "failed") {
    const writing = $("lf-import-steps").querySelector('[data-testid="lf-step-write"]').dataset.kind === "info";
    fail(writing ? "write" : "fetch", job.message);
    return null;
  }
  step("fetch", "done", "success");
  step("write", job.resync ? "updated" : "done", "success");
  message(job.resync ? `${job.folder.name}: ${job.message}` : job.message, "success");
  showReport(job.report || {});
  return job;
}

async function mySessions() {
  const page = await api(`/sessions?user=${encodeURIComponent(CFG.user)}&limit=100`, { accept: PAGINATION });
  return page.items || [];
}

function mounts(session, folderId) {
  return (session.mounts || []).some(m => m.vfolder === folderId);
}

function freeName(sessions, folderName) {
  const base = `import-${folderName.toLowerCase().replace(/[^a-z0-9_-]+/g, "-").replace(/^-+|-+$/g, "")}`.slice(0, 50);
  const taken = new Set(sessions.filter(s => LIVE.includes(s.status)).map(s => s.name));
  if (!taken.has(base)) {
    return base;
  }
  for (let i = 2; ; i += 1) {
    if (!taken.has(`${base}-${i}`)) {
      return `${base}-${i}`;
    }
  }
}

async function sessionBody(job, sessions) {
  const wanted = job.session || {};
  const options = await api(`/users/${encodeURIComponent(CFG.user)}/launch-options`);
  const projects = (options.projects || []).map(p => p.name);
  const project = wanted.project || projects[0];
  if (!project) {
    throw new ApiError(403, "you are in no project, so no session can open it: ask your domain admin to add you");
  }
  const defaults = options.defaults || {};
  const slots = { cpu: defaults.cpu || 1 };
  if (defaults.mem) {
    slots.mem = defaults.mem;
  }
  const gpu = Number(wanted.gpu || 0);
  if (gpu >= 1 && Number.isInteger(gpu)) {
    slots.gpu = gpu;
  } else if (gpu > 0) {
    slots["gpu.shares"] = gpu;
  }
  const body = {
    name: freeName(sessions, job.folder.name),
    project,
    type: "interactive",
    slots,
    vfolders: [job.folder.id],
  };
  if (wanted.image) {
    body.image = wanted.image;
  }
  if (wanted.resource_group) {
    body.resource_group = wanted.resource_group;
  }
  return body;
}

/** A running session that mounts the folder, else a new one: its name once it runs. */
async function sessionFor(job) {
  step("session", "looking…", "info");
  let sessions = await mySessions();
  const running = sessions.find(s => s.status === "RUNNING" && s.type === "interactive" && mounts(s, job.folder.id));
  if (running) {
    step("session", `${running.name} (running)`, "success");
    return running.name;
  }
  let name = sessions.find(s => LIVE.includes(s.status) && s.type === "interactive" && mounts(s, job.folder.id))?.name;
  if (!name) {
    const body = await sessionBody(job, sessions);
    step("session", `starting ${body.name}: ${slotText(body.slots)} in ${body.project}…`, "info");
    const started = await api("/sessions", { method: "POST", json: body });
    name = started.name || body.name;
  }
  const deadline = Date.now() + SESSION_WAIT_MS;
  while (Date.now() < deadline) {
    sessions = await mySessions();
    const s = sessions
      .filter(x => x.name === name)
      .sort((a, b) => String(b.created_at).localeCompare(String(a.created_at)))[0];
    if (s && s.status === "RUNNING") {
      step("session", `${name} (running)`, "success");
      return name;
    }
    if (s && FINAL.includes(s.status)) {
      throw new ApiError(409, `session ${name} ended (${s.status}): ${s.status_reason || "see its log on the Fleet home"}`);
    }
    if (s && s.status === "PENDING") {
      step("session", `${name} waits: ${s.waiting_for || s.status_reason || "no room yet"}`, "warning");
    } else if (s) {
      step("session", `${name}: ${s.status.toLowerCase()}…`, "info");
    }
    await sleep(POLL_MS * 2);
  }
  throw new ApiError(408, `session ${name} did not start within ${SESSION_WAIT_MS / 60000} minutes`);
}

function labUrl(server, job) {
  const path = ["vfolders", job.folder.name, job.path || ""].join("/");
  return `${CFG.hub}user/${userPath(CFG.user)}/${encodeURIComponent(server)}/lab/tree/${filePath(path)}`;
}

async function main() {
  const params = new URLSearchParams(window.location.search);
  const body = requestOf(params);
  for (const name of ["url", "folder", "open"]) {
    if (body[name]) {
      $(`lf-import-${name}`).value = body[name];
    }
  }
  $("lf-import-form").addEventListener("submit", event => {
    event.preventDefault();
    const next = new URLSearchParams(params);
    for (const name of ["url", "folder", "open"]) {
      const value = $(`lf-import-${name}`).value.trim();
      if (value) {
        next.set(name, value);
      } else {
        next.delete(name);
      }
    }
    window.location.search = next.toString();
  });
  if (!body.url) {
    return; // the form alone: nothing to import yet
  }
  show($("lf-import-form"), false);
  show($("lf-import-run"), true);
  $("lf-import-source").textContent = body.url + (body.branch ? ` (${body.branch})` : "");
  let job;
  try {
    job = await runImport(body);
  } catch (e) {
    fail("fetch", e.message);
    return;
  }
  if (!job) {
    return;
  }
  let server;
  try {
    server = await sessionFor(job);
  } catch (e) {
    fail("session", e.message);
    return;
  }
  const url = labUrl(server, job);
  const link = $("lf-import-open-link");
  link.href = url;
  link.textContent = `Open ${job.path || job.folder.name} in ${server}`;
  show(link, true);
  if (job.resync) {
    // The same link again: what the update did is the news; the session is a click away.
    step("open", "ready", "success");
    link.focus();
    return;
  }
  step("open", "opening…", "info");
  window.location.assign(url);
}

main();
