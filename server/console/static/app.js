// The console's page: plain JavaScript against /api, no framework, no build step.
"use strict";

const RANK = { none: 0, user: 1, viewer: 2, operator: 3, admin: 4 };
const $ = (id) => document.getElementById(id);
let session = JSON.parse(sessionStorage.getItem("stackd-session") || "null");
let me = null;
let chatAbort = null;

function keep(tokens) {
  session = tokens;
  if (tokens) sessionStorage.setItem("stackd-session", JSON.stringify(tokens));
  else sessionStorage.removeItem("stackd-session");
}

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || `HTTP ${status}`);
    this.status = status;
  }
}

// One call to /api: the access token on it, one refresh and retry when it has expired.
async function api(method, path, body, { raw = false, signal, retried = false } = {}) {
  const headers = {};
  if (session) headers.Authorization = `Bearer ${session.access_token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, signal,
                                       body: body === undefined ? undefined : JSON.stringify(body) });
  if (response.status === 401 && session && !retried && !path.startsWith("/api/auth/")) {
    if (await refresh()) return api(method, path, body, { raw, signal, retried: true });
  }
  if (raw && response.ok) return response;
  const data = response.headers.get("content-type")?.startsWith("application/json")
    ? await response.json() : null;
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

async function refresh() {
  try {
    keep(await api("POST", "/api/auth/refresh", { refresh_token: session.refresh_token }));
    return true;
  } catch {
    keep(null);
    showLogin("Your session has ended: log in again.");
    return false;
  }
}

// ---- logging in ---------------------------------------------------------------------------

function showLogin(message = "") {
  if (typeof stopDashboard === "function") stopDashboard();
  $("login-view").hidden = false;
  $("app-view").hidden = true;
  $("who").hidden = true;
  $("login-message").textContent = message;
}

async function login(event) {
  event.preventDefault();
  const credentials = { username: $("username").value, password: $("password").value };
  try {
    keep(await api("POST", "/api/auth/login", credentials));
    await showApp();
  } catch (error) {
    $("login-message").textContent = error.message;
  }
}

async function signup() {
  const credentials = { username: $("username").value, password: $("password").value };
  try {
    await api("POST", "/api/auth/signup", credentials);
    $("login-message").textContent = "Signed up: an admin must approve you. You can log in meanwhile.";
  } catch (error) {
    $("login-message").textContent = error.message;
  }
}

async function logout() {
  stopDashboard();
  if (session) await api("POST", "/api/auth/logout", { refresh_token: session.refresh_token }).catch(() => {});
  keep(null);
  showLogin();
}

// ---- the screens, by level ----------------------------------------------------------------

async function showApp() {
  me = await api("GET", "/api/me");
  $("login-view").hidden = true;
  $("app-view").hidden = false;
  $("who").hidden = false;
  $("who-name").textContent = me.username;
  $("who-level").textContent = me.level;
  const rank = RANK[me.level];
  const note = $("pending-note");
  note.hidden = rank > 0;
  note.textContent = me.state === "rejected"
    ? `Your account was rejected${me.reason ? ": " + me.reason : ""}.`
    : "Your account is waiting for an admin's approval.";
  $("users-card").hidden = rank < RANK.admin;
  $("devices-card").hidden = rank < RANK.user;
  $("topology-card").hidden = rank < RANK.user;
  $("chat-card").hidden = rank < RANK.viewer;
  $("cluster-card").hidden = rank < RANK.viewer;
  $("dashboard-card").hidden = rank < RANK.viewer;
  if (rank >= RANK.viewer) startDashboard();
  else stopDashboard();
  const loads = [];
  if (rank >= RANK.admin) loads.push(loadPending());
  if (rank >= RANK.user) loads.push(loadDevices(), loadTopology());
  await Promise.all(loads);
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function when(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "never";
}

async function loadPending() {
  const { data } = await api("GET", "/api/admin/users?state=pending");
  const body = $("pending").tBodies[0];
  body.replaceChildren();
  $("pending-empty").hidden = data.length > 0;
  for (const user of data) {
    const row = body.insertRow();
    row.dataset.user = user.username;
    cell(row, user.username);
    cell(row, when(user.created_at));
    const level = document.createElement("select");
    for (const name of ["user", "viewer", "operator", "admin"]) level.add(new Option(name, name, false, name === "viewer"));
    level.className = "level";
    row.insertCell().append(level);
    const actions = row.insertCell();
    actions.className = "actions";
    const approve = Object.assign(document.createElement("button"), { textContent: "Approve", className: "approve small" });
    const reject = Object.assign(document.createElement("button"), { textContent: "Reject", className: "reject small danger" });
    approve.onclick = () => decide(user.id, "approve", { level: level.value });
    reject.onclick = () => decide(user.id, "reject", { reason: prompt("Reason (optional)") || undefined });
    actions.append(approve, reject);
  }
}

async function decide(id, action, body) {
  try {
    await api("POST", `/api/admin/users/${encodeURIComponent(id)}/${action}`, body);
  } catch (error) {
    alert(error.message);
  }
  await loadPending();
}

async function loadDevices() {
  const { data } = await api("GET", "/api/devices");
  const body = $("devices").tBodies[0];
  body.replaceChildren();
  const select = $("chat-device");
  const chosen = select.value;
  select.replaceChildren();
  for (const device of data) {
    const row = body.insertRow();
    row.dataset.device = device.id;
    cell(row, device.name);
    cell(row, device.status, `status status-${device.status}`);
    cell(row, device.inference_url);
    cell(row, device.cluster_url);
    cell(row, when(device.last_seen_at));
    select.add(new Option(device.name, device.id, false, device.id === chosen));
  }
  if (RANK[me.level] >= RANK.viewer) await loadModels();
}

async function loadModels() {
  const select = $("chat-model");
  select.replaceChildren();
  if (!$("chat-device").value) return;
  try {
    const { data } = await api("GET", `/api/devices/${encodeURIComponent($("chat-device").value)}/models`);
    for (const model of data.filter((m) => (m.kind || "chat") === "chat")) select.add(new Option(model.id, model.id));
  } catch (error) {
    $("chat-message").textContent = error.message;
  }
}

async function loadTopology() {
  const body = $("topology").tBodies[0];
  body.replaceChildren();
  try {
    const topology = await api("GET", "/api/topology");
    $("topology-summary").textContent =
      `Cluster ${topology.cluster_id}: ${topology.node_count} node(s), leader ${topology.leader}`;
    for (const node of topology.nodes) {
      const row = body.insertRow();
      cell(row, node.id);
      cell(row, node.role);
      cell(row, `${node.ram_gb} GB`);
    }
  } catch (error) {
    $("topology-summary").textContent = error.message;
  }
}

// ---- chat: the answer streams in as the device produces it -------------------------------

async function chat(event) {
  event.preventDefault();
  const answer = $("chat-answer");
  answer.textContent = "";
  $("chat-message").textContent = "";
  chatAbort = new AbortController();
  $("chat-send").disabled = true;
  $("chat-stop").disabled = false;
  try {
    const response = await api("POST", "/api/inference", {
      device_id: $("chat-device").value, model: $("chat-model").value, stream: true,
      max_tokens: 64, messages: [{ role: "user", content: $("chat-input").value }],
    }, { raw: true, signal: chatAbort.signal });
    await readEvents(response, (event) => {
      const delta = event.choices && event.choices[0] && event.choices[0].delta;
      if (delta && delta.content) answer.textContent += delta.content;
      if (event.error) $("chat-message").textContent = event.error.message;
    });
    answer.dataset.done = "true";
  } catch (error) {
    if (error.name !== "AbortError") $("chat-message").textContent = error.message;
  } finally {
    $("chat-send").disabled = false;
    $("chat-stop").disabled = true;
  }
}

// Server-sent events from a fetch body: "data: {...}" lines, "[DONE]" at the end.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const payload = line.slice(6);
        if (payload === "[DONE]") return;
        onEvent(JSON.parse(payload));
      }
    }
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", login);
  $("signup").addEventListener("click", signup);
  $("logout").addEventListener("click", logout);
  $("devices-refresh").addEventListener("click", loadDevices);
  $("chat-device").addEventListener("change", loadModels);
  $("chat-form").addEventListener("submit", chat);
  $("chat-stop").addEventListener("click", () => chatAbort && chatAbort.abort());
  if (session) showApp().catch(() => showLogin());
  else showLogin();
});
