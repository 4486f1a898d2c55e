// The dashboard: the clusters as a graph, and per device its charts (uPlot), models and recent
// requests. Every 2 s while the page is open it asks /api for what came since its last sample;
// the console answers from its own memory and database, never by waiting on a device.
"use strict";

const WINDOW_SECONDS = 15 * 60;
const CHARTS = [
  { id: "tokens", title: "Tokens/s", series: [["generated_tps", "generated"], ["prompt_tps", "prompt"]] },
  { id: "requests", title: "Requests", series: [["requests_running", "in flight"], ["requests_waiting", "queued"]] },
  { id: "ttft", title: "Time to first token (ms)", series: [["ttft_p50_ms", "p50"], ["ttft_p95_ms", "p95"]] },
  { id: "itl", title: "Inter-token latency (ms)", series: [["itl_p50_ms", "p50"], ["itl_p95_ms", "p95"]] },
  { id: "kv", title: "KV cache (%)", series: [["kv_cache_pct", "in use"]] },
  { id: "memory", title: "Memory (MiB)", series: [["memory_used_mb", "node in use"], ["model_memory_mb", "models"]] },
  { id: "temperature", title: "Temperature (°C)", series: [["temperature_c", "temperature"]] },
  { id: "power", title: "Power (W)", series: [["power_budget_w", "budget"], ["power_draw_w", "draw"]] },
];
const COLORS = ["#2457c5", "#d9822b", "#1e7a3c", "#b3261e"];
const SVG = "http://www.w3.org/2000/svg";

let dashboardTimer = null;
let dashboardBusy = false;
let dashboardPolls = 0;
const panels = new Map();       // device id -> { element, charts, data, lastT }

function startDashboard() {
  if (dashboardTimer) return;
  pollDashboard();
  dashboardTimer = setInterval(pollDashboard, 2000);
}

function stopDashboard() {
  if (dashboardTimer) clearInterval(dashboardTimer);
  dashboardTimer = null;
  for (const panel of panels.values()) for (const chart of panel.charts.values()) chart.destroy();
  panels.clear();
  const holder = document.getElementById("device-panels");
  if (holder) holder.replaceChildren();
}

// One round: the clusters, then each device's new samples and recent requests, side by side.
// A round still running when the next is due is not doubled: the next one is skipped.
async function pollDashboard() {
  if (dashboardBusy || !session) return;
  dashboardBusy = true;
  try {
    const view = await api("GET", "/api/cluster");
    drawClusters(view.clusters);
    await Promise.all(view.devices.map((device) => updateDevice(device)));
    for (const id of [...panels.keys()]) {
      if (!view.devices.some((d) => d.id === id)) dropPanel(id);
    }
    dashboardPolls += 1;
    const card = $("dashboard-card");
    card.dataset.polls = dashboardPolls;
    $("dashboard-updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    $("dashboard-updated").textContent = error.message;
    if (error.status === 403) stopDashboard();
  } finally {
    dashboardBusy = false;
  }
}

// ---- the clusters: nodes and links as a graph, the leader marked, trouble in red ----------

function svg(name, attributes, parent) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  if (parent) parent.append(element);
  return element;
}

function placedText(parts) {
  return parts.map((p) => {
    if (p.split_mode === "replica") return `${p.model}: replica${p.state === "lost" ? " (lost)" : ""}`;
    if (p.layers !== undefined) return `${p.model}: ${p.layers} layers`;
    if (p.share !== undefined) return `${p.model}: ${Math.round(p.share * 100)} % tensor`;
    return `${p.model}: ${p.split_mode || "whole"}`;
  });
}

function drawClusters(clusters) {
  const holder = $("clusters");
  holder.replaceChildren();
  $("cluster-empty").hidden = clusters.length > 0;
  for (const cluster of clusters) {
    const box = document.createElement("div");
    box.className = `cluster cluster-${cluster.status}`;
    box.dataset.leader = cluster.leader;
    const title = document.createElement("p");
    title.className = "cluster-title";
    title.textContent = `Leader ${cluster.leader}: ${cluster.status}`;
    box.append(title);
    const width = 760, rowHeight = 150;
    const followers = cluster.nodes.filter((n) => !n.leader);
    const height = Math.max(rowHeight, 40 + 70 * Math.ceil(Math.max(followers.length, 1) / 3) + 60);
    const graph = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "cluster-graph", role: "img",
                               "aria-label": `cluster of ${cluster.leader}` }, box);
    const where = new Map();
    const leader = cluster.nodes.find((n) => n.leader);
    if (leader) where.set(leader.id, [120, height / 2]);
    followers.forEach((node, i) => {
      const column = i % 3, row = Math.floor(i / 3);
      where.set(node.id, [360 + column * 150, 50 + row * 90]);
    });
    for (const link of cluster.links) {
      const [a, b] = [where.get(link.source), where.get(link.target)];
      if (!a || !b) continue;
      svg("line", { x1: a[0], y1: a[1], x2: b[0], y2: b[1],
                    class: `link link-${link.status === "up" ? "up" : "down"}`,
                    "data-target": link.target }, graph);
    }
    for (const node of cluster.nodes) {
      const [x, y] = where.get(node.id);
      const trouble = node.degraded;
      const group = svg("g", { class: `node ${trouble ? "node-degraded" : "node-ok"}${node.leader ? " node-leader" : ""}`,
                               "data-node": node.id, "data-status": node.status,
                               transform: `translate(${x},${y})` }, graph);
      svg("circle", { r: node.leader ? 22 : 18 }, group);
      const name = svg("text", { y: -28, "text-anchor": "middle", class: "node-name" }, group);
      name.textContent = `${node.leader ? "★ " : ""}${node.id}`;
      const state = svg("text", { y: 5, "text-anchor": "middle", class: "node-state" }, group);
      state.textContent = node.status;
      placedText(node.placed).forEach((line, i) => {
        const text = svg("text", { y: 36 + i * 13, "text-anchor": "middle", class: "node-placed" }, group);
        text.textContent = line;
      });
      const tip = svg("title", {}, group);
      tip.textContent = [node.address, ...node.reasons].filter(Boolean).join("\n");
    }
    if (cluster.reasons.length) {
      const list = document.createElement("ul");
      list.className = "reasons";
      for (const reason of cluster.reasons) {
        const item = document.createElement("li");
        item.textContent = reason;
        list.append(item);
      }
      box.append(list);
    }
    holder.append(box);
  }
}

// ---- a device: its charts, models and recent requests -----------------------------------

function makePanel(device) {
  const element = document.createElement("article");
  element.className = "device-panel";
  element.dataset.device = device.id;
  element.innerHTML = `
    <h3><span class="device-name"></span> <span class="device-state badge"></span>
        <span class="device-error muted"></span></h3>
    <table class="models"><thead><tr><th>Model</th><th>State</th><th>Placement</th><th>Slots in use</th></tr></thead><tbody></tbody></table>
    <div class="charts"></div>
    <h4>Recent requests</h4>
    <table class="requests"><thead><tr><th>Time</th><th>Model</th><th>Key</th><th>Prompt</th><th>Generated</th>
      <th>TTFT (ms)</th><th>Duration (ms)</th><th>Status</th></tr></thead><tbody></tbody></table>
    <p class="requests-note muted"></p>`;
  element.querySelector(".device-name").textContent = device.name;
  const charts = new Map();
  const holder = element.querySelector(".charts");
  $("device-panels").append(element);
  for (const spec of CHARTS) {
    const box = document.createElement("div");
    box.className = "chart";
    box.dataset.chart = spec.id;
    box.dataset.points = "0";
    holder.append(box);
    const chart = new uPlot({
      title: spec.title, width: 300, height: 150, legend: { show: true },
      scales: { x: { time: true } },
      series: [{}, ...spec.series.map(([, label], i) => ({ label, stroke: COLORS[i], width: 1.5, spanGaps: false }))],
      axes: [{ size: 30 }, { size: 56 }],
    }, [[], ...spec.series.map(() => [])], box);
    charts.set(spec.id, chart);
  }
  const panel = { element, charts, samples: [], fields: null, lastT: null };
  panels.set(device.id, panel);
  return panel;
}

function dropPanel(id) {
  const panel = panels.get(id);
  for (const chart of panel.charts.values()) chart.destroy();
  panel.element.remove();
  panels.delete(id);
}

async function updateDevice(device) {
  const panel = panels.get(device.id) || makePanel(device);
  const state = device.reachable === null ? "unknown" : device.reachable ? "answering" : "not answering";
  const badge = panel.element.querySelector(".device-state");
  badge.textContent = state;
  badge.className = `device-state badge state-${state.replace(" ", "-")}`;
  panel.element.classList.toggle("unreachable", device.reachable === false);
  panel.element.querySelector(".device-error").textContent = device.error || "";
  drawModels(panel, device.models);
  await Promise.all([updateCharts(panel, device), updateRequests(panel, device)]);
}

function drawModels(panel, models) {
  const body = panel.element.querySelector(".models tbody");
  body.replaceChildren();
  for (const model of models) {
    const row = body.insertRow();
    row.dataset.model = model.id;
    if (model.degraded || model.state === "failed") row.className = "degraded";
    cell(row, model.id);
    cell(row, model.state + (model.error ? `: ${model.error}` : ""));
    cell(row, model.split_mode ? `${model.split_mode} on ${model.nodes.join(", ")}` : "");
    cell(row, model.slots_busy === null || model.slots_busy === undefined ? "" : String(model.slots_busy));
  }
}

async function updateCharts(panel, device) {
  const since = panel.lastT === null ? "" : `?since=${panel.lastT}`;
  let answer;
  try {
    answer = await api("GET", `/api/devices/${encodeURIComponent(device.id)}/metrics${since}`);
  } catch {
    return;
  }
  panel.fields = answer.fields;
  for (const sample of answer.samples) panel.samples.push(sample);
  if (answer.samples.length) panel.lastT = answer.samples[answer.samples.length - 1][0];
  const oldest = Date.now() / 1000 - WINDOW_SECONDS;
  while (panel.samples.length && panel.samples[0][0] < oldest) panel.samples.shift();
  const xs = panel.samples.map((s) => s[0]);
  for (const spec of CHARTS) {
    const columns = spec.series.map(([name]) => {
      const at = panel.fields.indexOf(name) + 1;
      return panel.samples.map((s) => s[at]);
    });
    const chart = panel.charts.get(spec.id);
    chart.setData([xs, ...columns]);
    const box = chart.root.parentElement;
    box.dataset.points = String(xs.length);
    box.dataset.first = xs.length ? String(xs[0]) : "";
    box.dataset.values = String(columns[0].filter((v) => v !== null).length);
    box.dataset.nonzero = String(columns[0].filter((v) => v !== null && v > 0).length);
    box.dataset.gaps = String(columns[0].filter((v) => v === null).length);
  }
}

async function updateRequests(panel, device) {
  const body = panel.element.querySelector(".requests tbody");
  const note = panel.element.querySelector(".requests-note");
  let answer;
  try {
    answer = await api("GET", `/api/devices/${encodeURIComponent(device.id)}/requests`);
  } catch (error) {
    note.textContent = `Recent requests: ${error.message}`;
    return;
  }
  note.textContent = answer.recording === false ? "This node does not record its requests." : "";
  body.replaceChildren();
  for (const r of answer.data.slice(0, 15)) {
    const row = body.insertRow();
    row.className = r.status >= 400 ? "failed" : "";
    cell(row, new Date(r.time * 1000).toLocaleTimeString());
    cell(row, r.model || "");
    cell(row, r.key || "");
    cell(row, r.prompt_tokens ?? "");
    cell(row, r.generated_tokens ?? "");
    cell(row, r.ttft_ms === null ? "" : r.ttft_ms.toFixed(1));
    cell(row, r.duration_ms.toFixed(1));
    cell(row, String(r.status));
  }
}
