/*
 * The Fleet home (templates/home.html): sessions, starting one, folders, usage, serving endpoints and
 * the announcement, all from the labfleet service's REST API as the browser's Hub login.
 *
 * Plain JavaScript modules, no build step, nothing loaded from elsewhere. Every request sends the
 * page's XSRF token (X-XSRFToken), as the Hub's cookie login asks of any fetch() but a page view (see
 * jupyterhub/_xsrf_utils.py). Everything shown from the API is set as text (textContent), never as HTML.
 */
import { CFG, $, api, attempt, el, show, state } from "./fleet-common.js";
import { createFolder, loadFolders } from "./fleet-folders.js";
import { changed, fillImages, loadOptions, loadSessions, renderSessions, startSession } from "./fleet-sessions.js";
import { loadEndpoints, loadUsage } from "./fleet-usage.js";

async function loadMe() {
  const me = await attempt(() => api("/me"), "Who you are");
  if (!me) {
    return;
  }
  state.me = me;
  const projects = (me.projects || []).map(p => p.full_name);
  const role = { superadmin: "superadmin", admin: "domain admin", monitor: "monitor" }[me.role] || "user";
  $("lf-me").textContent =
    `${me.full_name || me.username} · ${role} in domain ${me.domain.name}` +
    (projects.length ? ` · projects: ${projects.join(", ")}` : "");
  show($("lf-console-link"), CFG.console && ["superadmin", "admin", "monitor"].includes(me.role));
  show($("lf-new-folder"), me.role !== "monitor"); // a monitor changes nothing, folders included
  if (state.sessionsLoaded) {
    renderSessions(); // what "no session" says depends on the projects
  }
  const box = $("lf-no-project");
  if (!projects.length) {
    const admins = (me.domain_admins || []).filter(name => name !== me.username);
    let who;
    if (me.role === "monitor") {
      // A monitor reads the fleet and starts nothing: no project to ask for.
      box.replaceChildren(
        el("strong", {}, "You are a monitor: "),
        "you read the whole fleet in the Fleet admin console and start no sessions.",
      );
      box.hidden = false;
      return;
    }
    if (me.role === "superadmin" || me.role === "admin") {
      who = "You can add yourself to one in the Fleet admin console (Domains & Projects).";
    } else if (admins.length) {
      who = `The admins of your domain (${me.domain.name}) can add you: ${admins.join(", ")}.`;
    } else {
      who = `Ask an administrator of your domain (${me.domain.name}) to add you to a project.`;
    }
    box.replaceChildren(el("strong", {}, "You are in no project yet, "), "so you cannot start sessions. ", who);
    box.hidden = false;
  } else {
    box.hidden = true;
  }
}

async function loadAnnouncement() {
  let answer;
  try {
    answer = await api("/announcement");
  } catch (_) {
    return; // the page works without it
  }
  const a = answer && answer.announcement;
  const box = $("lf-announcement");
  if (!a || !a.text) {
    box.hidden = true;
    return;
  }
  box.className = `alert ${a.level === "warning" ? "alert-warning" : "alert-info"} lf-announcement`;
  box.style.whiteSpace = "pre-line";
  box.textContent = a.text;
  box.hidden = false;
}

function init() {
  $("lf-refresh").addEventListener("click", () => {
    loadSessions();
    loadFolders();
    loadUsage();
    loadEndpoints();
  });
  $("lf-start-form").addEventListener("submit", startSession);
  $("lf-start-project").addEventListener("change", () => {
    fillImages();
    changed();
  });
  for (const id of ["lf-start-image", "lf-start-group", "lf-start-name"]) {
    $(id).addEventListener("change", changed);
  }
  $("lf-new-folder").addEventListener("submit", createFolder);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) {
      loadSessions();
    }
  });
  loadAnnouncement();
  // Sessions first: the start form picks a name no live session has.
  Promise.all([loadMe(), loadSessions()]).then(loadOptions);
  loadFolders();
  loadUsage();
  loadEndpoints();
}

init();
