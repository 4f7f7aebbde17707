/*
 * The Fleet home's folders: list, create, rename, delete, share, invitations, and a file browser
 * (upload, download, new directory, rename, delete), all through the service's folder API.
 */
import { API, CFG, $, api, attempt, button, confirmButton, el, filePath, formatBytes, notify, state } from "./fleet-common.js";

export async function loadFolders() {
  const [folders, invitations] = await Promise.all([
    attempt(() => api("/vfolders"), "Your folders"),
    attempt(() => api("/vfolder-invitations"), "Invitations"),
  ]);
  if (folders) {
    state.folders = folders;
    renderFolders();
  }
  if (invitations) {
    renderInvitations(invitations);
  }
}

function renderInvitations(list) {
  const box = $("lf-invitations");
  const received = list.filter(i => i.invitee === CFG.user && i.state === "pending");
  const sent = list.filter(i => i.inviter === CFG.user && i.state === "pending");
  const rows = [];
  for (const i of received) {
    rows.push(
      el(
        "div",
        { class: "alert alert-info py-2 d-flex align-items-center gap-2", "data-testid": "lf-invitation" },
        el("span", { class: "me-auto" }, `${i.inviter} invites you to folder ${i.vfolder_name} (${i.permission}).`),
        button("Accept", () => answerInvitation(i, "accept"), "btn btn-sm btn-primary", { "data-testid": "lf-invitation-accept" }),
        button("Decline", () => answerInvitation(i, "decline"), "btn btn-sm btn-outline-secondary", { "data-testid": "lf-invitation-decline" }),
      ),
    );
  }
  for (const i of sent) {
    rows.push(
      el(
        "div",
        { class: "small text-body-secondary d-flex align-items-center gap-2 mb-1", "data-testid": "lf-invitation-sent" },
        el("span", { class: "me-auto" }, `You invited ${i.invitee} to ${i.vfolder_name} (${i.permission}); no answer yet.`),
        button("Cancel", () => cancelInvitation(i), "btn btn-sm btn-link"),
      ),
    );
  }
  box.replaceChildren(...rows);
}

async function answerInvitation(i, action) {
  const done = await attempt(
    () => api(`/vfolder-invitations/${encodeURIComponent(i.id)}/${action}`, { method: "POST" }),
    action === "accept" ? "Accept" : "Decline",
  );
  if (done) {
    notify(action === "accept" ? `Folder ${i.vfolder_name} is shared with you.` : "Invitation declined.", "success");
  }
  await loadFolders();
}

async function cancelInvitation(i) {
  await attempt(() => api(`/vfolder-invitations/${encodeURIComponent(i.id)}`, { method: "DELETE" }), "Cancel");
  await loadFolders();
}

function renderFolders() {
  const box = $("lf-folders");
  const live = state.folders.filter(f => f.status !== "DELETE_PENDING");
  if (!live.length) {
    box.replaceChildren(el("p", { class: "text-body-secondary mb-0" }, "No folders yet: create one above."));
    return;
  }
  box.replaceChildren(
    el(
      "table",
      { class: "table table-sm lf-table mb-0" },
      el(
        "thead",
        {},
        el("tr", {}, ["Name", "Owner", "Access", "Host", ""].map(h => el("th", { scope: "col" }, h))),
      ),
      el("tbody", {}, live.map(folderRow)),
    ),
  );
}

function folderRow(f) {
  const nameCell = el(
    "td",
    {},
    button(f.name, () => browse(f, ""), "btn btn-link btn-sm p-0 fw-semibold", { "data-testid": "lf-folder-open" }),
  );
  const actions = el("td", { class: "lf-actions" });
  const row = el(
    "tr",
    { "data-testid": "lf-folder", "data-folder": f.id, "data-name": f.name },
    nameCell,
    el("td", {}, f.owner),
    el("td", {}, f.permission, f.usage_mode && f.usage_mode !== "general" ? ` · ${f.usage_mode}` : ""),
    el("td", {}, f.host),
    actions,
  );
  actions.append(button("Browse", () => browse(f, ""), undefined, { "data-testid": "lf-folder-browse" }));
  if (f.can_manage || f.is_owner) {
    actions.append(
      button("Rename", () => inlineRename(nameCell, f.name, name => renameFolder(f, name))),
      button("Share", () => shareForm(row, f)),
      confirmButton("Delete", "Really delete?", () => deleteFolder(f)),
    );
  }
  return row;
}

/** Replace ``cell``'s content with a name input; ``save(name)`` on Enter or Save. */
function inlineRename(cell, current, save) {
  const input = el("input", { class: "form-control form-control-sm", value: current, "aria-label": "New name" });
  const restore = [...cell.childNodes];
  const form = el(
    "form",
    {
      class: "d-flex gap-1",
      onsubmit: async e => {
        e.preventDefault();
        const name = input.value.trim();
        if (name && name !== current) {
          await save(name);
        } else {
          cell.replaceChildren(...restore);
        }
      },
    },
    input,
    el("button", { type: "submit", class: "btn btn-sm btn-primary" }, "Save"),
    button("Cancel", () => cell.replaceChildren(...restore)),
  );
  cell.replaceChildren(form);
  input.focus();
  input.select();
}

async function renameFolder(f, name) {
  const done = await attempt(
    () => api(`/vfolders/${encodeURIComponent(f.id)}`, { method: "PATCH", json: { name } }),
    "Rename",
  );
  if (done) {
    notify(`Folder ${f.name} is now ${name}.`, "success");
  }
  await loadFolders();
}

async function deleteFolder(f) {
  const done = await attempt(() => api(`/vfolders/${encodeURIComponent(f.id)}`, { method: "DELETE" }), "Delete");
  if (done) {
    notify(`Folder ${f.name} moved to the trash.`, "success");
    if (state.browse && state.browse.folder.id === f.id) {
      closeBrowser();
    }
  }
  await loadFolders();
}

function shareForm(row, f) {
  const next = row.nextElementSibling;
  if (next && next.dataset.shareFor === f.id) {
    next.remove();
    return;
  }
  const invitee = el("input", { class: "form-control form-control-sm", placeholder: "user name", required: true, "aria-label": "Invite whom" });
  const permission = el(
    "select",
    { class: "form-select form-select-sm", "aria-label": "Permission" },
    el("option", { value: "ro" }, "read only"),
    el("option", { value: "rw" }, "read and write"),
    el("option", { value: "wd" }, "read, write and delete"),
  );
  const form = el(
    "form",
    {
      class: "d-flex gap-2 align-items-center",
      onsubmit: async e => {
        e.preventDefault();
        const done = await attempt(
          () =>
            api(`/vfolders/${encodeURIComponent(f.id)}/invitations`, {
              method: "POST",
              json: { invitee: invitee.value.trim(), permission: permission.value },
            }),
          "Share",
        );
        if (done) {
          notify(`${done.invitee} is invited to ${f.name}.`, "success");
          shareRow.remove();
          await loadFolders();
        }
      },
    },
    el("span", { class: "text-nowrap" }, `Share ${f.name} with`),
    invitee,
    permission,
    el("button", { type: "submit", class: "btn btn-sm btn-primary text-nowrap" }, "Invite"),
  );
  const shareRow = el("tr", { "data-share-for": f.id }, el("td", { colspan: 5 }, form));
  row.after(shareRow);
  invitee.focus();
}

function closeBrowser() {
  state.browse = null;
  $("lf-browser").hidden = true;
}

async function browse(folder, path) {
  const listing = await attempt(
    () => api(`/vfolders/${encodeURIComponent(folder.id)}/files/${filePath(path)}`),
    `Folder ${folder.name}`,
  );
  if (!listing) {
    return;
  }
  state.browse = { folder, path: listing.path || "" };
  renderBrowser(listing);
}

function filesUrl(folder, path) {
  return `${API}/vfolders/${encodeURIComponent(folder.id)}/files/${filePath(path)}`;
}

function renderBrowser(listing) {
  const { folder, path } = state.browse;
  const box = $("lf-browser");
  const crumbs = el("nav", { class: "lf-crumbs me-auto", "aria-label": "Path" });
  crumbs.append(button(folder.name, () => browse(folder, ""), "btn btn-link btn-sm"));
  const parts = path.split("/").filter(Boolean);
  parts.forEach((part, i) => {
    crumbs.append(" / ", button(part, () => browse(folder, parts.slice(0, i + 1).join("/")), "btn btn-link btn-sm"));
  });
  const upload = el("input", {
    type: "file",
    multiple: true,
    class: "d-none",
    "data-testid": "lf-upload-input",
    onchange: () => uploadFiles(upload.files),
  });
  const toolbar = el(
    "div",
    { class: "d-flex align-items-center gap-1 mb-2 flex-wrap" },
    crumbs,
    upload,
    button("Upload", () => upload.click(), "btn btn-sm btn-outline-primary", { "data-testid": "lf-upload" }),
    button("New directory", () => newDirectory(toolbar)),
    el(
      "a",
      { class: "btn btn-sm btn-outline-secondary", href: `${filesUrl(folder, path)}?archive=tar`, download: "" },
      "Download all (tar)",
    ),
    button("Close", closeBrowser),
  );
  const entries = (listing.entries || []).slice().sort((a, b) => {
    if ((a.type === "dir") !== (b.type === "dir")) {
      return a.type === "dir" ? -1 : 1;
    }
    return a.name.localeCompare(b.name);
  });
  const body = entries.length
    ? el(
        "table",
        { class: "table table-sm lf-table mb-0" },
        el("thead", {}, el("tr", {}, ["Name", "Size", "Modified", ""].map(h => el("th", { scope: "col" }, h)))),
        el("tbody", {}, entries.map(entryRow)),
      )
    : el("p", { class: "text-body-secondary mb-0", "data-testid": "lf-browser-empty" }, "This directory is empty.");
  box.replaceChildren(toolbar, body);
  box.hidden = false;
}

function entryRow(e) {
  const { folder } = state.browse;
  const isDir = e.type === "dir";
  const nameCell = el(
    "td",
    {},
    isDir
      ? button(`${e.name}/`, () => browse(folder, e.path), "btn btn-link btn-sm p-0")
      : el("span", {}, e.name),
  );
  const actions = el("td", { class: "lf-actions" });
  if (!isDir) {
    actions.append(
      el(
        "a",
        { class: "btn btn-sm btn-outline-secondary", href: filesUrl(folder, e.path), download: e.name, "data-testid": "lf-file-download" },
        "Download",
      ),
    );
  }
  actions.append(
    button("Rename", () => inlineRename(nameCell, e.name, name => moveEntry(e, name))),
    confirmButton("Delete", "Really delete?", () => deleteEntry(e)),
  );
  return el(
    "tr",
    { "data-testid": "lf-file", "data-name": e.name },
    nameCell,
    el("td", {}, isDir ? "" : formatBytes(e.size)),
    el("td", {}, e.mtime ? new Date(e.mtime * 1000).toLocaleString() : ""),
    actions,
  );
}

function refreshBrowser() {
  return state.browse ? browse(state.browse.folder, state.browse.path) : undefined;
}

function joined(dir, name) {
  return dir ? `${dir}/${name}` : name;
}

async function uploadFiles(files) {
  const { folder, path } = state.browse;
  for (const file of Array.from(files)) {
    const done = await attempt(
      () => api(`/vfolders/${encodeURIComponent(folder.id)}/files/${filePath(joined(path, file.name))}`, { method: "PUT", body: file }),
      `Upload of ${file.name}`,
    );
    if (done) {
      notify(`Uploaded ${file.name} (${formatBytes(file.size)}).`, "success");
    }
  }
  await refreshBrowser();
}

function newDirectory(toolbar) {
  const { folder, path } = state.browse;
  const input = el("input", { class: "form-control form-control-sm", placeholder: "directory name", "aria-label": "Directory name" });
  const form = el(
    "form",
    {
      class: "d-flex gap-1 mb-2",
      onsubmit: async ev => {
        ev.preventDefault();
        const name = input.value.trim();
        if (!name) {
          return;
        }
        await attempt(
          () => api(`/vfolders/${encodeURIComponent(folder.id)}/mkdir`, { method: "POST", json: { path: joined(path, name) } }),
          "New directory",
        );
        await refreshBrowser();
      },
    },
    input,
    el("button", { type: "submit", class: "btn btn-sm btn-primary" }, "Create"),
  );
  toolbar.after(form);
  input.focus();
}

async function moveEntry(e, name) {
  const { folder, path } = state.browse;
  await attempt(
    () => api(`/vfolders/${encodeURIComponent(folder.id)}/move`, { method: "POST", json: { from: e.path, to: joined(path, name) } }),
    "Rename",
  );
  await refreshBrowser();
}

async function deleteEntry(e) {
  const { folder } = state.browse;
  const done = await attempt(
    () => api(`/vfolders/${encodeURIComponent(folder.id)}/files/${filePath(e.path)}`, { method: "DELETE" }),
    "Delete",
  );
  if (done) {
    notify(`${e.name} moved to the folder's trash.`, "success");
  }
  await refreshBrowser();
}

export async function createFolder(event) {
  event.preventDefault();
  const input = $("lf-new-folder-name");
  const name = input.value.trim();
  if (!name) {
    return;
  }
  const done = await attempt(() => api("/vfolders", { method: "POST", json: { name } }), "New folder");
  if (done) {
    input.value = "";
    notify(`Folder ${done.name} created.`, "success");
  }
  await loadFolders();
}
