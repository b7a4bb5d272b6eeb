// herder dashboard: plain JS, no framework, no build step. Every page is a static shell;
// this script fetches its data from the JSON API with the session cookie, and refreshes when
// the server-sent event stream says a job changed. Data is written with textContent only.
"use strict";

const ACTIVE = new Set(["queued", "claimed", "running"]);
const state = { session: null, refresh: null, timer: null, pending: false };

// -- small helpers -----------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function badge(text, cls) { return el("span", { class: `badge ${cls}`, text }); }
function gb(value) { return value === null || value === undefined ? "–" : Number(value).toFixed(1); }

function age(iso) {
  if (!iso) return "–";
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 60) return `${Math.round(seconds)}s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)}m`;
  if (seconds < 86400) return `${(seconds / 3600).toFixed(1)}h`;
  return `${(seconds / 86400).toFixed(1)}d`;
}

function when(iso) { return iso ? new Date(iso).toLocaleString() : "–"; }

function notice(text, bad) {
  const box = document.getElementById("notice");
  box.textContent = text || "";
  box.className = bad ? "notice bad" : "notice";
  box.hidden = !text;
}

class HttpError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

async function api(path, options = {}) {
  const init = { credentials: "same-origin", headers: {}, ...options };
  if (init.method && init.method !== "GET" && state.session && state.session.csrf) {
    init.headers["X-Herder-CSRF"] = state.session.csrf;
  }
  const response = await fetch(path, init);
  if (response.status === 401) {
    window.location.assign("/ui/login");
    throw new HttpError(401, "signed out");
  }
  if (!response.ok) {
    let detail = response.statusText;
    try { const body = await response.json(); detail = body.detail || body.error || detail; }
    catch (_) { /* not JSON */ }
    throw new HttpError(response.status, typeof detail === "string" ? detail : JSON.stringify(detail));
  }
  return response;
}

async function json(path, options) { return (await api(path, options)).json(); }

async function act(path, what) {
  try {
    await api(path, { method: "POST" });
    notice("");
  } catch (error) {
    notice(`${what}: ${error.message}`, true);
  }
  schedule(0);
}

// -- refreshing: on load, on the live stream's signal (at most once a second), on a timer ---------

function schedule(delay) {
  if (state.timer !== null) return;
  state.timer = setTimeout(async () => {
    state.timer = null;
    if (state.pending) { schedule(1000); return; }
    state.pending = true;
    try { await state.refresh(); }
    catch (error) { if (error.status !== 401) notice(error.message, true); }
    finally { state.pending = false; }
  }, delay);
}

function live() {
  const dot = document.getElementById("live");
  const source = new EventSource("/api/v1/dashboard/changes?wait=25");
  source.addEventListener("open", () => { dot.classList.add("on"); dot.title = "live"; });
  source.addEventListener("changed", () => schedule(250));
  source.addEventListener("error", () => { dot.classList.remove("on"); dot.title = "reconnecting"; });
}

// -- the frame: who is signed in, sign out ------------------------------------------------------

async function frame() {
  state.session = await json("/api/v1/dashboard/session");
  document.getElementById("who").textContent = `${state.session.name} · ${state.session.scope}`;
  const page = document.body.dataset.page;
  const current = document.getElementById(page === "fleet" ? "nav-fleet" : "nav-jobs");
  if (current) current.classList.add("current");
  document.getElementById("logout").addEventListener("click", async () => {
    await fetch("/ui/logout", { method: "POST", credentials: "same-origin",
      headers: { "X-Herder-CSRF": state.session.csrf || "" } });
    window.location.assign("/ui/login");
  });
}

// -- fleet ---------------------------------------------------------------------------------------

function ramCell(host) {
  const total = host.ram_total_gb || 1;
  const bar = el("div", { class: "bar" });
  const booked = el("div", { class: "booked" });
  booked.style.width = `${Math.min(100, (100 * host.booked_gb) / total)}%`;
  const bookable = el("div", { class: "bookable", title: `bookable ${gb(host.bookable_gb)} GB` });
  bookable.style.left = `${Math.min(99.5, (100 * host.bookable_gb) / total)}%`;
  bar.append(booked, bookable);
  const parts = [`booked ${gb(host.booked_gb)} / bookable ${gb(host.bookable_gb)} of ${gb(host.ram_total_gb)}`];
  if (host.measured_available_gb !== null && host.measured_available_gb !== undefined) {
    const used = host.ram_total_gb - host.measured_available_gb;
    if (used > 0) { // an agent on a bigger machine than declared measures more than the total
      const measured = el("div", { class: "measured", title: `measured in use ${gb(used)} GB` });
      measured.style.left = `${Math.min(99, (100 * used) / total)}%`;
      bar.append(measured);
    }
    parts.push(`measured free ${gb(host.measured_available_gb)}`);
  }
  return el("td", { class: "ram" }, bar, el("div", { class: "bar-label", text: parts.join(" · ") }));
}

function hostRow(host, accounts) {
  const health = el("td", {}, badge(host.health, `h-${host.health}`));
  if (host.agent_down) health.append(el("div", { class: "sub", text: host.agent_down }));
  else if (host.agent) health.append(el("div", { class: "sub", text: `agent ${host.agent}` }));
  const breakers = Object.entries(host.breakers || {}).map(([type, text]) =>
    el("div", { class: "sub", text: `${type}: ${text}` }));
  for (const [type, text] of Object.entries(host.preflight_failed || {})) {
    breakers.push(el("div", { class: "sub", text: `${type}: preflight failed: ${text}` }));
  }
  const mine = accounts.filter((account) => account.host === host.label).map((account) =>
    el("div", { class: `sub a-${account.state}`, title: account.detail,
      text: `${account.name}: ${account.state} (${account.sessions}/${account.max_sessions})` }));
  const actions = el("td", {});
  const up = host.transport === "up"; // `herder up`'s machine: shown, never placed on
  if (state.session.can_admin && !up) {
    actions.append(host.enabled
      ? el("button", { type: "button", class: "quiet drain", text: "Drain",
          onclick: () => act(`/api/v1/hosts/${encodeURIComponent(host.label)}/drain`, "drain") })
      : el("button", { type: "button", class: "enable", text: "Enable",
          onclick: () => act(`/api/v1/hosts/${encodeURIComponent(host.label)}/enable`, "enable") }));
  }
  return el("tr", { "data-host": host.label },
    el("td", {}, el("b", { text: host.label }),
      el("div", { class: "sub", text: [up ? "herder up" : host.transport, ...(host.labels || [])].join(" · ") })),
    health,
    el("td", {}, host.window, el("div", { class: "sub",
      text: `max ${host.max_workers}${host.max_weight ? ` · ≤ ${host.max_weight}` : ""}` })),
    el("td", { class: "num slots", text: `${host.workers} / ${host.max_workers}` }),
    ramCell(host),
    el("td", {}, breakers.length ? breakers : el("span", { class: "sub", text: "closed" })),
    el("td", {}, mine.length ? mine : el("span", { class: "sub", text: "–" })),
    el("td", { class: "state" }, host.enabled ? badge("enabled", "st-enabled") : badge("drained", "st-drained")),
    actions);
}

async function fleet() {
  const view = await json("/queue?recent=0");
  const counts = document.getElementById("counts");
  counts.replaceChildren(...Object.entries(view.counts).map(([status, count]) =>
    el("a", { class: "count", href: `/ui/jobs?status=${status}`, "data-status": status },
      el("b", { text: count }), el("span", {}, badge(status, `s-${status}`)))));
  document.getElementById("leader").textContent =
    view.leader ? "this server is the scheduler's leader" : "";
  document.getElementById("alerts").replaceChildren(...view.alerts.map((alert) =>
    el("div", { class: "alert", text: `${alert.message} (since ${when(alert.opened_at)})` })));
  document.querySelector("#hosts tbody").replaceChildren(
    ...view.hosts.map((host) => hostRow(host, view.accounts)));
  document.getElementById("no-hosts").hidden = view.hosts.length > 0;
}

// -- jobs ----------------------------------------------------------------------------------------

const FILTERS = ["status", "job_type", "host", "dedup_key"];

function jobsQuery() {
  const params = new URLSearchParams(window.location.search);
  const query = new URLSearchParams();
  for (const name of [...FILTERS, "before"]) {
    const value = params.get(name);
    if (value) query.set(name, value);
  }
  return query;
}

function go(query) {
  const text = query.toString();
  window.history.pushState(null, "", `/ui/jobs${text ? `?${text}` : ""}`);
  schedule(0);
}

function jobRow(job) {
  return el("tr", { "data-job": job.id },
    el("td", { class: "num" }, el("a", { href: `/ui/jobs/${job.id}`, text: job.id })),
    el("td", { text: job.dedup_key || "" }),
    el("td", { text: job.job_type }),
    el("td", {}, badge(job.status, `s-${job.status}`)),
    el("td", { class: "num", text: job.priority }),
    el("td", { text: job.weight }),
    el("td", { class: "num", text: `${job.attempt} / ${job.max_attempts}` }),
    el("td", { class: "num", title: when(job.created_at), text: age(job.created_at) }),
    el("td", { text: job.host || "" }),
    el("td", { class: "why", text: job.why || job.failure_reason || "" }));
}

async function jobs() {
  const query = jobsQuery();
  const page = await json(`/api/v1/dashboard/jobs?${query}`);
  document.querySelector("#jobs tbody").replaceChildren(...page.jobs.map(jobRow));
  document.getElementById("no-jobs").hidden = page.jobs.length > 0;
  const older = document.getElementById("older");
  older.disabled = page.next_before === null;
  older.onclick = () => { const next = jobsQuery(); next.set("before", page.next_before); go(next); };
  const first = !query.get("before");
  document.getElementById("newer").disabled = first;
  document.getElementById("newest").disabled = first;
}

function jobsControls() {
  const form = document.getElementById("filters");
  const params = new URLSearchParams(window.location.search);
  for (const name of FILTERS) form.elements[name].value = params.get(name) || "";
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const query = new URLSearchParams();
    for (const name of FILTERS) {
      const value = form.elements[name].value.trim();
      if (value) query.set(name, value);
    }
    go(query);
  });
  document.getElementById("f-clear").addEventListener("click", () => { form.reset(); go(new URLSearchParams()); });
  document.getElementById("newest").addEventListener("click", () => {
    const query = jobsQuery(); query.delete("before"); go(query);
  });
  document.getElementById("newer").addEventListener("click", () => window.history.back());
  window.addEventListener("popstate", () => {
    const now = new URLSearchParams(window.location.search);
    for (const name of FILTERS) form.elements[name].value = now.get(name) || "";
    schedule(0);
  });
}

// -- one job -------------------------------------------------------------------------------------

const tail = { attempt: null, offset: 0, decoder: null, busy: false };

function field(name, value) {
  return el("div", {}, el("dt", { text: name }), el("dd", { text: value === null || value === undefined || value === "" ? "–" : value }));
}

function bytes(value) {
  if (value === null || value === undefined) return null;
  return value >= 2 ** 30 ? `${(value / 2 ** 30).toFixed(2)} GB` : `${Math.round(value / 2 ** 20)} MB`;
}

function peak(attempts) {
  const peaks = attempts.map((a) => a.peak_rss_bytes).filter((v) => v !== null && v !== undefined);
  return peaks.length ? bytes(Math.max(...peaks)) : null;
}

async function job() {
  const id = window.location.pathname.split("/").pop();
  const detail = await json(`/api/v1/jobs/${id}`);
  document.title = `herder · job ${detail.id}`;
  document.getElementById("title").textContent = `Job ${detail.id} · ${detail.job_type}`;
  const status = document.getElementById("status");
  status.textContent = detail.status + (detail.cancel_requested && ACTIVE.has(detail.status) ? " (cancelling)" : "");
  status.className = `badge s-${detail.status}`;
  status.dataset.status = detail.status;
  const why = await json(`/api/v1/jobs/${id}/why`);
  document.getElementById("why").textContent = why.why;
  document.getElementById("fields").replaceChildren(
    field("priority", detail.priority), field("weight", detail.weight),
    field("attempts", `${detail.attempt} / ${detail.max_attempts}`),
    field("failures", `${detail.failures} (lost ${detail.lost})`),
    field("host", detail.host), field("dedup key", detail.dedup_key),
    field("outcome", detail.outcome), field("exit code", detail.exit_code),
    field("failure reason", detail.failure_reason),
    field("cost", detail.cost_usd === null || detail.cost_usd === undefined ? null : `$${detail.cost_usd.toFixed(4)}`),
    field("peak RAM", peak(detail.attempts)),
    field("created", when(detail.created_at)), field("started", when(detail.started_at)),
    field("finished", when(detail.finished_at)),
    field("command", detail.command.join(" ")), field("workdir", detail.workdir));
  document.querySelector("#attempts tbody").replaceChildren(...detail.attempts.map((a) =>
    el("tr", {}, el("td", { class: "num", text: a.attempt }), el("td", { text: a.host }),
      el("td", { text: when(a.claimed_at) }), el("td", { text: when(a.started_at) }),
      el("td", { text: when(a.ended_at) }),
      el("td", {}, a.outcome ? a.outcome : badge("live", "s-running")),
      el("td", { class: "num", text: a.exit_code === null ? "" : a.exit_code }),
      el("td", { class: "num", text: bytes(a.peak_rss_bytes) || "" }))));
  document.getElementById("events").replaceChildren(...detail.events.map((event) =>
    el("li", {}, el("time", { text: when(event.at) }), el("span", { class: "kind", text: event.kind }),
      el("span", { class: "muted", text: [event.from_status && `${event.from_status} → ${event.to_status}`,
        event.attempt ? `attempt ${event.attempt}` : null,
        Object.keys(event.detail || {}).length ? JSON.stringify(event.detail) : null].filter(Boolean).join(" · ") }))));
  document.getElementById("result").textContent = detail.result ? JSON.stringify(detail.result, null, 2) : "none";
  const canAct = state.session.can_submit;
  document.getElementById("cancel").hidden = !(canAct && ACTIVE.has(detail.status) && !detail.cancel_requested);
  document.getElementById("retry").hidden = !(canAct && !ACTIVE.has(detail.status));
  state.jobStatus = detail.status;
  if (ACTIVE.has(detail.status)) state.lastActive = Date.now();
  state.jobAttempt = detail.attempt;
  await followLog(id, detail.attempt);
}

async function followLog(id, attempt) {
  // Reads the job's latest attempt's log from where it stopped (the log route's offset); a
  // new attempt starts a new log. Called on every refresh and once a second while active.
  if (tail.busy || !attempt) return;
  tail.busy = true;
  try {
    const box = document.getElementById("log");
    if (tail.attempt !== attempt) {
      tail.attempt = attempt; tail.offset = 0; tail.decoder = new TextDecoder();
      box.textContent = "";
      document.getElementById("log-attempt").textContent = `attempt ${attempt}`;
    }
    for (;;) {
      const query = new URLSearchParams({ attempt, offset: tail.offset });
      const response = await fetch(`/api/v1/jobs/${id}/log?${query}`, { credentials: "same-origin" });
      if (!response.ok) return; // 404: nothing logged yet
      const bytes = new Uint8Array(await response.arrayBuffer());
      if (bytes.length === 0) return;
      const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
      box.append(tail.decoder.decode(bytes, { stream: true }));
      tail.offset += bytes.length;
      if (atBottom) box.scrollTop = box.scrollHeight;
    }
  } finally {
    tail.busy = false;
  }
}

function jobControls() {
  const id = window.location.pathname.split("/").pop();
  document.getElementById("cancel").addEventListener("click", () => act(`/api/v1/jobs/${id}/cancel`, "cancel"));
  document.getElementById("retry").addEventListener("click", () => act(`/api/v1/jobs/${id}/retry`, "retry"));
  // The log grows without a job event: poll it by offset while the job is active, and a
  // little after (an agent ships its last lines around the time it reports the end).
  setInterval(() => {
    if (ACTIVE.has(state.jobStatus) || Date.now() - (state.lastActive || 0) < 15000) {
      followLog(id, state.jobAttempt).catch(() => {});
    }
  }, 1000);
}

// -- start -----------------------------------------------------------------------------------------

async function main() {
  const page = document.body.dataset.page;
  try { await frame(); } catch (error) { if (error.status !== 401) notice(error.message, true); return; }
  if (page === "fleet") {
    state.refresh = fleet;
    setInterval(() => schedule(0), 5000); // liveness changes without a job event
  } else if (page === "jobs") {
    state.refresh = jobs;
    jobsControls();
  } else if (page === "job") {
    state.refresh = job;
    jobControls();
  }
  schedule(0);
  live();
}

document.addEventListener("DOMContentLoaded", main);
