/*
 * The Fleet home's sessions (with why a pending one waits and where it is in the queue; open, logs,
 * stop) and starting one from a card or a recent choice, with a preview of what would happen.
 */
import {
  ApiError, CFG, ENDED_SHOWN, FINAL, PAGINATION, RECENT_KEY, SETTLING, $, api, attempt, button,
  confirmButton, el, formatBytes, formatNumber, gpuText, notify, show, slotText, state, statusBadge, userPath,
} from "./fleet-common.js";

async function fetchSessions() {
  const base = `/sessions?user=${encodeURIComponent(CFG.user)}`;
  const first = await api(`${base}&limit=100`, { accept: PAGINATION });
  const total = first._pagination ? first._pagination.total : first.items.length;
  if (total <= 100) {
    return first.items;
  }
  const last = await api(`${base}&offset=${total - 100}&limit=100`, { accept: PAGINATION });
  return last.items; // oldest first: the newest 100
}

let sessionTimer = null;
export async function loadSessions() {
  clearTimeout(sessionTimer);
  const rows = await attempt(fetchSessions, "Your sessions");
  if (rows) {
    state.sessions = rows.sort((a, b) => String(b.created_at).localeCompare(String(a.created_at)));
    await addQueuePositions(state.sessions);
    state.sessionsLoaded = true;
    renderSessions();
  }
  // Quickly while a session is on its way (or was just started or stopped from here), else now and then.
  const settling = state.sessions.some(s => SETTLING.includes(s.status)) || Date.now() < state.fastUntil;
  sessionTimer = setTimeout(loadSessions, settling ? 2000 : 15000);
}

async function addQueuePositions(rows) {
  const pending = rows.filter(s => s.status === "PENDING" && s.queue_position === undefined);
  await Promise.all(
    pending.slice(0, 10).map(async s => {
      try {
        const detail = await api(`/sessions/${encodeURIComponent(s.id)}`);
        s.queue_position = detail.queue_position;
        s.waiting_for = s.waiting_for || detail.waiting_for;
      } catch (_) {
        // it may have ended meanwhile
      }
    }),
  );
}

function sessionRow(s) {
  const actions = el("td", { class: "lf-actions" });
  if (s.status === "RUNNING") {
    actions.append(
      el(
        "a",
        {
          class: "btn btn-sm btn-primary",
          href: `${CFG.hub}user/${userPath(s.user)}/${encodeURIComponent(s.name)}/`,
          "data-testid": "lf-session-open",
        },
        "Open",
      ),
    );
  }
  actions.append(
    button("Logs", () => showLogs(s), "btn btn-sm btn-outline-secondary", { "data-testid": "lf-session-logs" }),
  );
  if (s.endpoint) {
    // A serving replica: the controller would only start it again; the endpoint is scaled instead.
    actions.append(el("span", { class: "lf-why", "data-testid": "lf-session-replica" }, `scale endpoint ${s.endpoint} to stop it`));
  } else if (!FINAL.includes(s.status) && s.status !== "TERMINATING") {
    actions.append(
      confirmButton("Stop", "Really stop?", () => stopSession(s), { "data-testid": "lf-session-stop" }),
    );
  }
  const why = [];
  if (s.status === "PENDING") {
    if (s.queue_position !== undefined && s.queue_position !== null) {
      why.push(`number ${s.queue_position} in the queue`);
    }
    why.push(s.waiting_for || s.status_reason || "waiting for room");
  } else if (s.status_reason && s.status !== "RUNNING") {
    why.push(s.status_reason);
  }
  return el(
    "tr",
    { "data-testid": "lf-session", "data-session": s.id, "data-name": s.name },
    el(
      "td",
      {},
      el("strong", {}, s.name || "(default)"),
      el("div", { class: "lf-why" }, s.endpoint ? `replica of endpoint ${s.endpoint}` : s.type),
    ),
    el("td", {}, s.project),
    el("td", {}, s.image || "–"),
    el("td", {}, el("div", {}, slotText(s.slots)), el("div", { class: "lf-why" }, gpuText(s), s.node ? ` · ${s.node}` : "")),
    el(
      "td",
      {},
      statusBadge(s.status),
      why.length ? el("div", { class: "lf-why", "data-testid": "lf-session-why" }, why.join(" · ")) : null,
    ),
    actions,
  );
}

function sessionTable(rows) {
  return el(
    "table",
    { class: "table table-sm lf-table mb-2" },
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        ["Name", "Project", "Environment", "Resources", "Status", ""].map(h => el("th", { scope: "col" }, h)),
      ),
    ),
    el("tbody", {}, rows.map(sessionRow)),
  );
}

export function renderSessions() {
  const live = state.sessions.filter(s => !FINAL.includes(s.status));
  const ended = state.sessions.filter(s => FINAL.includes(s.status)).slice(0, ENDED_SHOWN);
  const box = $("lf-sessions");
  const parts = [];
  if (live.length) {
    parts.push(el("div", { "data-testid": "lf-sessions-live" }, sessionTable(live)));
  } else {
    parts.push(
      el(
        "p",
        { class: "text-body-secondary", "data-testid": "lf-sessions-none" },
        state.me && !(state.me.projects || []).length ? "No session." : "No session is running. Start one below.",
      ),
    );
  }
  if (ended.length) {
    const details = el(
      "details",
      { "data-testid": "lf-sessions-ended" },
      el("summary", { class: "text-body-secondary" }, `Recently ended (${ended.length})`),
      sessionTable(ended),
    );
    if (box.querySelector("details[open]")) {
      details.open = true;
    }
    parts.push(details);
  }
  box.replaceChildren(...parts);
}

async function stopSession(s) {
  // The service ends the session and asks the Hub to stop its server; a queued one is cancelled
  // (its pending spawn then fails).
  const done = await attempt(() => api(`/sessions/${encodeURIComponent(s.id)}`, { method: "DELETE" }), "Stop");
  if (done) {
    notify(`Session ${s.name || "(default)"} ${s.status === "PENDING" ? "cancelled" : "stopped"}.`, "success");
    state.fastUntil = Date.now() + 30000;
  }
  await loadSessions();
}

async function showLogs(s) {
  const pre = $("lf-logs");
  if (!pre.hidden && pre.dataset.session === s.id) {
    pre.hidden = true;
    return;
  }
  const text = await attempt(
    () => api(`/sessions/${encodeURIComponent(s.id)}/logs?tail=65536`, { text: true }),
    "Logs",
  );
  if (text === undefined) {
    return;
  }
  pre.dataset.session = s.id;
  pre.textContent = text || `(session ${s.name} has written no log yet)`;
  pre.hidden = false;
  pre.scrollTop = pre.scrollHeight;
}

// ------------------------------------------------------------ start

const CARDS = [
  { id: "cpu", title: "CPU only", slots: { cpu: 1 } },
  { id: "half-gpu", title: "Half a GPU", slots: { cpu: 1, "gpu.shares": 0.5 } },
  { id: "gpu", title: "A whole GPU", slots: { cpu: 1, gpu: 1 } },
];

function imagesFor(project) {
  return (state.options.images || []).filter(i => (i.projects || []).includes(project));
}

function groupsFor() {
  return (state.options.resource_groups || []).filter(g =>
    (g.session_types || ["interactive"]).includes("interactive"),
  );
}

/** Why ``slots`` cannot start in ``project`` as far as the quota left tells, or "". */
function shortOf(project, slots) {
  const p = (state.options.projects || []).find(x => x.name === project);
  if (!p) {
    return "not one of your projects";
  }
  const left = p.left || {};
  const asks = { ...slots };
  if (asks.gpu) {
    asks["gpu.shares"] = asks.gpu; // a whole device counts as its shares too
  }
  for (const [slot, amount] of Object.entries(asks)) {
    const l = left[slot];
    if (l !== null && l !== undefined && Number(amount) > Number(l) + 1e-9) {
      return `${slot} left: ${slot === "mem" ? formatBytes(l) : formatNumber(l)}`;
    }
  }
  return "";
}

function choiceLabel(c) {
  return `${c.project} · ${c.image || "default image"} · ${slotText(c.slots)}`;
}

function card(title, detail, choice, testid, blocked) {
  const b = el(
    "button",
    {
      type: "button",
      class: "lf-card",
      "aria-pressed": "false",
      "data-testid": testid,
      disabled: blocked ? true : false,
      title: blocked || undefined,
      onclick: () => pick(choice, b),
    },
    el("span", { class: "lf-card-title" }, title),
    el("span", { class: "lf-card-detail" }, detail),
    blocked ? el("span", { class: "lf-card-detail text-danger" }, blocked) : null,
  );
  return b;
}

function renderCards() {
  const box = $("lf-cards");
  const projects = state.options.projects || [];
  if (!projects.length) {
    box.replaceChildren(el("p", { class: "text-body-secondary mb-0" }, "Sessions start in a project: you have none yet."));
    return;
  }
  const project = projects[0].name;
  const image = imagesFor(project)[0];
  const group = groupsFor()[0];
  box.replaceChildren(
    ...CARDS.map(c => {
      const choice = {
        label: c.title,
        project,
        image: image ? image.name : undefined,
        resource_group: group ? group.name : undefined,
        slots: c.slots,
      };
      return card(c.title, `${slotText(c.slots)} · ${project}`, choice, `lf-card-${c.id}`, shortOf(project, c.slots));
    }),
  );
  renderRecent();
}

function readRecent() {
  try {
    const list = JSON.parse(localStorage.getItem(RECENT_KEY) || "[]");
    return Array.isArray(list) ? list : [];
  } catch (_) {
    return [];
  }
}

function keyOf(c) {
  return JSON.stringify([c.project, c.image || "", c.resource_group || "", c.slots]);
}

function remember(choice) {
  const entry = {
    label: choice.label,
    project: choice.project,
    image: choice.image,
    resource_group: choice.resource_group,
    slots: choice.slots,
  };
  const list = [entry, ...readRecent().filter(c => keyOf(c) !== keyOf(entry))].slice(0, 4);
  try {
    localStorage.setItem(RECENT_KEY, JSON.stringify(list));
  } catch (_) {
    // private windows may refuse: nothing to remember then
  }
  renderRecent();
}

function renderRecent() {
  const projects = new Set((state.options.projects || []).map(p => p.name));
  const list = readRecent().filter(
    c => c && typeof c.project === "string" && projects.has(c.project) && c.slots && typeof c.slots === "object",
  );
  $("lf-recent").replaceChildren(
    ...list.map((c, i) =>
      card(String(c.label || "Recent"), choiceLabel(c), c, `lf-recent-${i}`, shortOf(c.project, c.slots)),
    ),
  );
  show($("lf-recent-wrap"), list.length > 0);
}

function fillSelect(select, items, selected) {
  select.replaceChildren(...items.map(([value, text]) => el("option", { value }, text)));
  if (selected !== undefined && items.some(([v]) => v === selected)) {
    select.value = selected;
  }
}

function freeName() {
  const taken = new Set(state.sessions.filter(s => !FINAL.includes(s.status)).map(s => s.name));
  if (!taken.has("work")) {
    return "work";
  }
  for (let i = 2; ; i += 1) {
    if (!taken.has(`work-${i}`)) {
      return `work-${i}`;
    }
  }
}

function pick(choice, cardButton) {
  for (const b of document.querySelectorAll(".lf-card")) {
    b.setAttribute("aria-pressed", b === cardButton ? "true" : "false");
  }
  state.choice = { ...choice };
  const form = $("lf-start-form");
  fillSelect(
    $("lf-start-project"),
    (state.options.projects || []).map(p => [p.name, p.name]),
    choice.project,
  );
  fillImages(choice.image);
  fillSelect(
    $("lf-start-group"),
    groupsFor().map(g => [g.name, g.description ? `${g.name}: ${g.description}` : g.name]),
    choice.resource_group,
  );
  $("lf-start-name").value = freeName();
  form.hidden = false;
  changed();
}

export function fillImages(selected) {
  const project = $("lf-start-project").value;
  fillSelect(
    $("lf-start-image"),
    imagesFor(project).map(i => [i.name, i.display_name || i.name]),
    selected,
  );
}

function currentBody() {
  const c = state.choice;
  const body = {
    project: $("lf-start-project").value,
    name: $("lf-start-name").value.trim(),
    type: "interactive",
    slots: c.slots,
  };
  if ($("lf-start-image").value) {
    body.image = $("lf-start-image").value;
  }
  if ($("lf-start-group").value) {
    body.resource_group = $("lf-start-group").value;
  }
  return body;
}

let previewSeq = 0;
export async function changed() {
  const body = currentBody();
  const user = encodeURIComponent(CFG.user);
  const server = encodeURIComponent(body.name || "");
  $("lf-spawn-form").href = `${CFG.hub}hub/spawn/${user}${server ? `/${server}` : ""}`;
  $("lf-start-summary").textContent = `Asks ${slotText(body.slots)} in ${body.project}.`;
  const warning = $("lf-start-warning");
  const short = shortOf(body.project, body.slots);
  if (short) {
    warning.dataset.outcome = "refused";
    warning.textContent = `Your quota would refuse this: ${short}.`;
    warning.hidden = false;
    return;
  }
  warning.hidden = true;
  const seq = ++previewSeq;
  let answer;
  try {
    answer = await api("/sessions/preview", { method: "POST", json: body });
  } catch (e) {
    if (e instanceof ApiError && e.status !== 404 && e.status !== 405 && seq === previewSeq) {
      warning.dataset.outcome = "refused";
      warning.textContent = `This would be refused: ${e.message}`;
      warning.hidden = false;
    }
    return; // no preview here (an older service): the start itself will say
  }
  if (seq !== previewSeq || !answer) {
    return;
  }
  if (answer.outcome === "waits" || answer.outcome === "refused") {
    warning.dataset.outcome = answer.outcome;
    warning.textContent =
      answer.outcome === "waits"
        ? `This would wait in the queue: ${answer.message}`
        : `This would be refused: ${answer.message}`;
    warning.hidden = false;
  }
}

export async function startSession(event) {
  event.preventDefault();
  const body = currentBody();
  const go = $("lf-start-go");
  go.disabled = true;
  go.textContent = "Starting…";
  try {
    const view = await attempt(() => api("/sessions", { method: "POST", json: body }), "Start");
    if (view) {
      remember({ ...state.choice, project: body.project, image: body.image, resource_group: body.resource_group });
      notify(
        view.status === "PENDING"
          ? `Session ${body.name} waits: ${view.waiting_for || view.status_reason || "no room yet"}`
          : `Session ${body.name} is starting.`,
        view.status === "PENDING" ? "warning" : "success",
      );
      $("lf-start-form").hidden = true;
      state.fastUntil = Date.now() + 30000;
      for (const b of document.querySelectorAll(".lf-card")) {
        b.setAttribute("aria-pressed", "false");
      }
    }
  } finally {
    go.disabled = false;
    go.textContent = "Start";
  }
  await loadSessions();
}

export async function loadOptions() {
  const options = await attempt(
    () => api(`/users/${encodeURIComponent(CFG.user)}/launch-options`),
    "What you can start",
  );
  if (!options) {
    return;
  }
  state.options = options;
  renderCards();
}
