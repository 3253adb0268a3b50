/* The pymq web console: a page per hash route, every figure and action through the admin API.
 *
 * Security: the session is an HttpOnly cookie this script cannot read; the CSRF token the log-in
 * returns lives only in memory and goes with every POST in X-CSRF-Token.  Everything shown is built
 * with textContent (message bodies and headers are other people's data: never parsed as HTML).
 * Permissions are the API's: a refused action shows the broker's refusal.
 */
"use strict";

const state = { csrf: null, user: null, admin: false, writer: true, view: null, timer: null, busy: false, vhost: "" };

/* The lists the virtual-host selector narrows (their `vhost` argument, spec/admin.md "Virtual hosts"). */
const VHOST_LISTS = new Set(["list-queues", "list-topics", "list-subscriptions", "list-destinations", "metrics",
  "connections", "list-consumers", "list-dead-letter-queues"]);

/* Controls that change something are shown only to users who may be allowed to use them: a user whose
 * only role is monitor gets none (the API refuses them anyway); the rest are decided by the API. */
function writable(node) { return state.writer ? node : null; }

// -- the API ---------------------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, error) {
    super(error && error.message ? error.message : `HTTP ${status}`);
    this.status = status;
    this.code = error && error.code ? error.code : "error";
  }
}

async function api(op, args = {}, { write = false } = {}) {
  let response;
  if (state.vhost && VHOST_LISTS.has(op) && args.vhost === undefined) args = { ...args, vhost: state.vhost };
  if (write) {
    response = await fetch(`/api/${op}`, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": state.csrf || "" },
      body: JSON.stringify(args),
    });
  } else {
    const query = new URLSearchParams();
    for (const [k, v] of Object.entries(args)) if (v !== undefined && v !== null) query.set(k, String(v));
    const qs = query.toString();
    response = await fetch(`/api/${op}${qs ? "?" + qs : ""}`, { credentials: "same-origin" });
  }
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (response.status === 401) {
    showLogin("Your session ended; log in again.");
    throw new ApiError(401, body && body.error);
  }
  if (!body || !body.ok) throw new ApiError(response.status, body && body.error);
  return body.result;
}

// -- DOM helpers -----------------------------------------------------------------------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function fmt(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (typeof value === "number") return Number.isInteger(value) ? value.toLocaleString("en") : value.toFixed(1);
  if (Array.isArray(value)) return value.join(", ") || "–";
  if (typeof value === "object") return Object.entries(value).map(([k, v]) => `${k}: ${fmt(v)}`).join("; ") || "–";
  return String(value);
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}

function time(ms) {
  return ms ? new Date(ms).toISOString().replace("T", " ").replace("Z", " UTC") : "–";
}

/* Headers that carry an instant as epoch milliseconds: shown as a date, with the number after it. */
const TIME_HEADERS = new Set(["timestamp", "expires", "pymq-dead-at", "pymq-expired-at", "AMQ_SCHEDULED_TIME",
  "pymq-deliver-at", "deliver-at", "pymq-dead-lettered-at"]);
function headerValue(name, value) {
  if ((TIME_HEADERS.has(name) || /-(at|time)$/i.test(name)) && /^\d{10,16}$/.test(value) && Number(value) > 0) {
    return `${time(Number(value))} (${value})`;
  }
  return value;
}

/* A table: columns are [heading, key | (row) => value | Node, {class}] */
function table(rows, columns, { rowAttrs, empty = "none" } = {}) {
  const numeric = columns.map(([, key]) => rows.length > 0 && typeof key === "string" &&
    rows.every(row => typeof row[key] === "number"));
  const head = h("tr", {}, columns.map(([title, , opts], i) =>
    h("th", { class: [opts && opts.class, numeric[i] ? "num" : null].filter(Boolean).join(" ") || null }, title)));
  const body = rows.length ? rows.map(row => h("tr", rowAttrs ? rowAttrs(row) : {}, columns.map(([, key, opts]) => {
    const value = typeof key === "function" ? key(row) : row[key];
    const cls = [opts && opts.class, typeof value === "number" ? "num" : null].filter(Boolean).join(" ");
    return h("td", { class: cls || null, "data-col": typeof key === "string" ? key : (opts && opts.col) },
      value instanceof Node ? value : fmt(value));
  }))) : [h("tr", {}, h("td", { colspan: columns.length, class: "empty" }, empty))];
  return h("table", { class: "grid" }, h("thead", {}, head), h("tbody", {}, body));
}

function flash(message, kind = "info") {
  const el = document.getElementById("flash");
  el.textContent = message;
  el.className = `flash ${kind}`;
  el.hidden = false;
  clearTimeout(flash.timer);
  flash.timer = setTimeout(() => { el.hidden = true; }, kind === "error" ? 12000 : 5000);
}

function refusal(err) {
  return `${err.code}: ${err.message}`;
}

/* A button that asks "sure?" on the first click and acts on the second (no modal dialogs). */
function confirmButton(label, confirmLabel, action, attrs = {}) {
  const button = h("button", { type: "button", ...attrs }, label);
  let armed = false;
  button.addEventListener("click", async () => {
    if (!armed) {
      armed = true;
      button.textContent = confirmLabel;
      button.classList.add("danger");
      setTimeout(() => { if (armed) { armed = false; button.textContent = label; button.classList.remove("danger"); } }, 5000);
      return;
    }
    armed = false;
    button.disabled = true;
    try { await action(); } finally { button.disabled = false; button.textContent = label; button.classList.remove("danger"); }
  });
  return button;
}

async function act(op, args, done) {
  try {
    const result = await api(op, args, { write: true });
    if (done) flash(done(result), "ok");
    await refresh();
    return result;
  } catch (err) {
    if (err.status !== 401) flash(refusal(err), "error");
    return null;
  }
}


/* "name: value" lines as a headers object (blank lines ignored); a line without a colon is an error. */
function parseHeaders(text) {
  const headers = {};
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    const at = line.indexOf(":");
    if (at <= 0) throw new Error(`header line without "name: value": ${line}`);
    headers[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  }
  return headers;
}

/* Publish one message (headers, body, persistent) to a fixed destination, or to the one typed. */
function publishForm(fixed) {
  const destination = fixed ? null : h("input", { id: "publish-destination", placeholder: "/queue/name or /topic/name", required: true });
  const headers = h("textarea", { id: "publish-headers", rows: 3, placeholder: "name: value (one per line)" });
  const body = h("textarea", { id: "publish-body", rows: 4, placeholder: "message body (text)" });
  const persistent = h("input", { id: "publish-persistent", type: "checkbox", checked: true });
  return h("form", { id: "publish-form", class: "stack-form", onsubmit: async e => {
    e.preventDefault();
    let parsed;
    try { parsed = parseHeaders(headers.value); } catch (err) { flash(err.message, "error"); return; }
    const target = fixed || destination.value;
    const r = await act("publish", { destination: target, headers: parsed, body: body.value, persistent: persistent.checked },
      r => `published ${r.bytes} byte(s) to ${r.destination}${r.persistent ? " (persistent)" : ""}`);
    if (r) body.value = "";
  } }, h("strong", {}, "Publish a message"), destination ? h("label", {}, "Destination ", destination) : null,
    h("label", {}, "Headers ", headers), h("label", {}, "Body ", body),
    h("label", { class: "check" }, persistent, " persistent"), h("button", { type: "submit", id: "publish-submit" }, "Publish"));
}

// -- log-in ----------------------------------------------------------------------------------------
function showLogin(message) {
  stopTimer();
  state.csrf = null;
  document.getElementById("app").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message || "";
  document.getElementById("login-user").focus();
}

// high availability (spec/ha.md §1.8): the header says the role of this process in its group
function nodeLine(s) {
  const role = s.ha ? ` · ${s.ha.role} (epoch ${s.ha.epoch})` : "";
  return `node ${s.node} · ${s.version}${role}`;
}

/* The virtual-host selector: shown when the broker has vhosts besides "/" and the user may list them
 * (administrators and the monitor role); "all" shows the whole broker. */
function pickVhosts() {
  const select = document.getElementById("vhost");
  api("list-vhosts").then(rows => {
    select.replaceChildren(h("option", { value: "" }, "all"), ...rows.map(v => h("option", { value: v.name }, v.name)));
    select.value = state.vhost;
    document.getElementById("vhost-pick").hidden = rows.length < 2;
  }, () => { document.getElementById("vhost-pick").hidden = true; });
  select.onchange = () => { state.vhost = select.value; refresh(); };
}

function enter(session) {
  state.csrf = session.csrf;
  state.user = session.user;
  state.admin = session.admin;
  const roles = session.roles || [];
  state.writer = session.admin || !(roles.length > 0 && roles.every(r => r === "monitor"));
  document.getElementById("nav-users").hidden = !session.admin;
  document.getElementById("login").hidden = true;
  document.getElementById("app").hidden = false;
  document.getElementById("whoami").textContent = `${session.user}${session.admin ? " (admin)" : ""}`;
  api("status").then(s => { document.getElementById("node").textContent = nodeLine(s); }, () => {});
  pickVhosts();
  route();
}

async function login(event) {
  event.preventDefault();
  const user = document.getElementById("login-user").value;
  const password = document.getElementById("login-password").value;
  const response = await fetch("/api/session", {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify({ user, password }),
  });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  document.getElementById("login-password").value = "";
  if (!body || !body.ok) {
    document.getElementById("login-error").textContent = body && body.error ? body.error.message : "log-in failed";
    return;
  }
  enter(body.result);
}

async function logout() {
  try {
    await fetch("/api/session", { method: "DELETE", credentials: "same-origin",
      headers: { "X-CSRF-Token": state.csrf || "" } });
  } finally {
    showLogin("Logged out.");
  }
}

// -- pages -----------------------------------------------------------------------------------------
const pages = {};

pages.overview = () => {
  const tiles = h("div", { class: "tiles", id: "tiles" });
  const charts = {
    rates: new LineChart(h("canvas", { id: "chart-rates" }), { series: [
      { key: "rate_in", label: "in /s", color: "#2563eb" }, { key: "rate_out", label: "delivered /s", color: "#16a34a" },
      { key: "rate_ack", label: "acked /s", color: "#f59e0b" }] }),
    depth: new LineChart(h("canvas", { id: "chart-depth" }), { series: [
      { key: "depth", label: "queue depth", color: "#7c3aed" },
      { key: "subscription_depth", label: "subscription depth", color: "#db2777" }] }),
    connections: new LineChart(h("canvas", { id: "chart-connections" }), { series: [
      { key: "connections", label: "connections", color: "#0891b2" }] }),
    memory: new LineChart(h("canvas", { id: "chart-memory" }), { series: [
      { key: "rss_bytes", label: "process memory", color: "#dc2626" },
      { key: "held_bytes", label: "message bytes held", color: "#65a30d" }], format: bytes }),
  };
  const panel = (title, chart) => h("figure", { class: "chart" }, h("figcaption", {}, title), chart.canvas);
  const el = h("section", { class: "page", id: "page-overview" }, h("h2", {}, "Overview"), tiles,
    h("div", { class: "charts" }, panel("Message rates", charts.rates), panel("Depth", charts.depth),
      panel("Connections", charts.connections), panel("Memory", charts.memory)));
  return {
    el,
    async update() {
      const o = await api("overview");
      const s = o.status;
      document.getElementById("node").textContent = nodeLine(s);
      const tile = (label, value, id) => h("div", { class: "tile", id }, h("span", { class: "label" }, label),
        h("span", { class: "value" }, value));
      if (s.role && s.role !== "live") {     // a backup: no broker core to describe yet
        const holder = s.ha && s.ha.holder ? `${s.ha.holder.host} pid ${s.ha.holder.pid}` : "none yet";
        tiles.replaceChildren(tile("Role", s.role, "tile-role"), tile("Epoch", fmt(s.ha.epoch), "tile-epoch"),
          tile("Live", holder, "tile-holder"), tile("Takeovers", fmt(s.ha.takeovers), "tile-takeovers"));
        return;
      }
      tiles.replaceChildren(
        tile("Status", s.ready ? "ready" : "NOT READY", "tile-ready"),
        tile("Connections", fmt(s.connections), "tile-connections"),
        tile("Queues", fmt(s.queues), "tile-queues"),
        tile("Topics", fmt(s.topics), "tile-topics"),
        tile("Messages", fmt(s.messages.depth), "tile-depth"),
        tile("In / out per s", `${fmt(s.rates.rate_in)} / ${fmt(s.rates.rate_out)}`, "tile-rates"),
        tile("Memory", `${bytes(s.memory.rss_bytes)} (${bytes(s.memory.held_bytes)} held)`, "tile-memory"),
        tile("Up", `${Math.round(s.uptime_s)} s`, "tile-uptime"));
      for (const chart of Object.values(charts)) chart.update(o.history);
    },
  };
};

const QUEUE_LINK = q => h("a", { href: `#/queues/${encodeURIComponent(q.name)}`, class: "queue-link" }, q.name);

pages.queues = () => {
  const list = h("div", { id: "queue-list" });
  const name = h("input", { id: "new-queue-name", placeholder: "name", required: true });
  const maxDeliveries = h("input", { id: "new-queue-max-deliveries", type: "number", min: 0, placeholder: "10" });
  const maxDepth = h("input", { id: "new-queue-max-depth", type: "number", min: 0, placeholder: "0 = unbounded" });
  const overflow = h("select", { id: "new-queue-overflow" }, ["block", "reject", "drop-oldest"].map(o => h("option", { value: o }, o)));
  const form = h("form", { id: "create-queue", class: "inline-form", onsubmit: async e => {
    e.preventDefault();
    const config = { overflow: overflow.value };
    if (maxDeliveries.value !== "") config.max_deliveries = Number(maxDeliveries.value);
    if (maxDepth.value !== "") config.max_depth = Number(maxDepth.value);
    const created = await act("create-queue", { name: name.value, config },
      r => `queue ${r.queue.name} ${r.created ? "created" : "already exists"}`);
    if (created) name.value = "";
  } }, h("strong", {}, "Create a queue"), h("label", {}, "Name ", name),
    h("label", {}, "Max deliveries ", maxDeliveries), h("label", {}, "Max depth ", maxDepth),
    h("label", {}, "Overflow ", overflow), h("button", { type: "submit", id: "create-queue-submit" }, "Create"));
  return {
    el: h("section", { class: "page", id: "page-queues" }, h("h2", {}, "Queues"), list, writable(form)),
    async update() {
      const rows = await api("list-queues");
      list.replaceChildren(table(rows, [
        ["Name", QUEUE_LINK], ["Vhost", "vhost"], ["Depth", "depth"], ["Ready", "ready"], ["In flight", "in_flight"],
        ["Scheduled", "scheduled"], ["Consumers", "consumers"], ["In /s", "rate_in"], ["Out /s", "rate_out"],
        ["Ack /s", "rate_ack"], ["Dead-lettered", "dead_lettered"], ["Owner", "owner"],
        ["", q => writable(confirmButton("Purge", `Purge ${q.name}?`, () => act("purge-queue", { name: q.name },
          r => `purged ${r.purged_messages} messages from ${q.name}`), { class: "purge", "data-queue": q.name })),
         { col: "actions" }],
      ], { rowAttrs: q => ({ "data-queue": q.name }), empty: "no queues yet" }));
    },
  };
};

pages.queue = (queueName) => {
  const PAGE = 20;
  const KEEP = 150;                       // samples kept: 5 minutes at one every 2 s
  let offset = 0;
  let selected = null;
  const samples = [];
  const charts = {
    depth: new LineChart(h("canvas", { id: "queue-chart-depth" }), { series: [
      { key: "depth", label: "depth", color: "#7c3aed" }, { key: "in_flight", label: "in flight", color: "#0891b2" }] }),
    rates: new LineChart(h("canvas", { id: "queue-chart-rates" }), { series: [
      { key: "rate_in", label: "in /s", color: "#2563eb" }, { key: "rate_out", label: "delivered /s", color: "#16a34a" },
      { key: "rate_ack", label: "acked /s", color: "#f59e0b" }] }),
  };
  const panel = (title, chart) => h("figure", { class: "chart" }, h("figcaption", {}, title), chart.canvas);
  const chartBox = h("div", { class: "charts", id: "queue-charts" }, panel("Depth", charts.depth), panel("Rates", charts.rates));
  const alterField = (key, label, attrs = {}) => h("label", {}, `${label} `, h("input", { id: `alter-${key}`, "data-key": key, type: "number", ...attrs }));
  const overflow = h("select", { id: "alter-overflow" }, h("option", { value: "" }, "(unchanged)"),
    ["block", "reject", "drop-oldest"].map(o => h("option", { value: o }, o)));
  const alterForm = h("form", { id: "alter-queue", class: "inline-form", onsubmit: async e => {
    e.preventDefault();
    const config = {};
    for (const input of alterForm.querySelectorAll("input[data-key]")) if (input.value !== "") config[input.dataset.key] = Number(input.value);
    if (overflow.value) config.overflow = overflow.value;
    if (Object.keys(config).length === 0) { flash("nothing to change", "error"); return; }
    const r = await act("alter-queue", { name: queueName, config }, r => `altered ${queueName}: ${fmt(r.changes)}`);
    if (r) for (const input of alterForm.querySelectorAll("input[data-key]")) input.value = "";
  } }, h("strong", {}, "Alter"), alterField("max_deliveries", "Max deliveries", { min: 0 }),
    alterField("max_depth", "Max depth", { min: 0 }), h("label", {}, "Overflow ", overflow),
    alterField("delivery_timeout_ms", "Delivery timeout ms", { min: 0 }), alterField("default_priority", "Default priority", { min: 0, max: 9 }),
    h("button", { type: "submit", id: "alter-submit" }, "Alter"));
  const dropButton = confirmButton("Drop queue", `Drop ${queueName} and its messages?`, async () => {
    const r = await act("drop-queue", { name: queueName, force: true }, r => `dropped ${queueName} (${r.dropped_messages} message(s))`);
    if (r) location.hash = "#/queues";
  }, { id: "drop-queue" });
  const summary = h("div", { id: "queue-summary" });
  const browser = h("div", { id: "message-browser" });
  const detail = h("div", { id: "message-detail", class: "detail" });
  const pager = h("div", { class: "pager" },
    h("button", { type: "button", id: "page-prev", onclick: () => { offset = Math.max(0, offset - PAGE); refresh(); } }, "← Previous"),
    h("span", { id: "page-info" }),
    h("button", { type: "button", id: "page-next", onclick: () => { offset += PAGE; refresh(); } }, "Next →"));

  async function showMessage(id) {
    selected = id;
    try {
      const m = await api("get-message", { name: queueName, message_id: id, body_limit: 65536 });
      const target = h("input", { id: "move-target", placeholder: "target queue" });
      const isDead = "pymq-original-destination" in m.headers;
      detail.replaceChildren(
        h("h3", {}, `Message ${m.message_id}`),
        table(Object.entries(m.headers).map(([k, v]) => ({ k, v: headerValue(k, v) })), [["Header", "k"], ["Value", "v"]],
          { rowAttrs: r => ({ "data-header": r.k }) }),
        h("h4", {}, `Body (${m.body_size} bytes${m.body_truncated ? ", first 64 KiB" : ""}${"body_base64" in m ? ", binary as base64" : ""})`),
        h("pre", { id: "message-body", class: "body" }, "body" in m ? m.body : m.body_base64),
        writable(h("div", { class: "actions" },
          isDead ? h("button", { type: "button", id: "retry-message", onclick: () => act("retry-dead-letters",
            { name: queueName, message_ids: [m.message_id] }, r => `retried ${r.moved} message(s)`).then(() => detail.replaceChildren()) },
            `Retry to ${m.headers["pymq-original-destination"]}`) : null,
          h("form", { class: "inline-form", id: "move-form", onsubmit: async e => {
            e.preventDefault();
            const r = await act("move-messages", { from: queueName, to: target.value, message_ids: [m.message_id] },
              r => `moved ${r.moved} message(s) to ${target.value}`);
            if (r) detail.replaceChildren();
          } }, h("label", {}, "Move to ", target), h("button", { type: "submit" }, "Move")),
          confirmButton("Delete", "Delete this message?", async () => {
            const r = await act("drop-messages", { name: queueName, message_ids: [m.message_id] }, r => `deleted ${r.dropped} message(s)`);
            if (r) detail.replaceChildren();
          }, { id: "drop-message" }))));
    } catch (err) {
      if (err.status !== 401) detail.replaceChildren(h("p", { class: "error" }, refusal(err)));
    }
  }

  return {
    el: h("section", { class: "page", id: "page-queue" },
      h("h2", {}, h("a", { href: "#/queues" }, "Queues"), " / ", queueName), summary, chartBox,
      writable(h("div", { class: "queue-forms" }, alterForm, publishForm(`/queue/${queueName}`))),
      h("h3", {}, "Messages (ready, in delivery order)"), browser, pager, detail),
    async update() {
      try {
        const q = await api("queue-info", { name: queueName });
        const m = q.metrics;
        samples.push({ t: Date.now(), depth: m.depth, in_flight: m.in_flight, rate_in: m.rate_in || 0,
          rate_out: m.rate_out || 0, rate_ack: m.rate_ack || 0 });
        if (samples.length > KEEP) samples.shift();
        for (const chart of Object.values(charts)) chart.update(samples);
        summary.replaceChildren(
          h("div", { class: "tiles" },
            ...[["Depth", m.depth, "depth"], ["Ready", m.ready, "ready"], ["In flight", m.in_flight, "in_flight"],
              ["Scheduled", m.scheduled, "scheduled"], ["Consumers", m.consumers, "consumers"],
              ["Added", m.added, "added"], ["Delivered", m.delivered, "delivered"], ["Acknowledged", m.acknowledged, "acknowledged"],
              ["Dead-lettered", m.dead_lettered, "dead_lettered"], ["Expired", m.expired, "expired"]]
              .map(([label, value, key]) => h("div", { class: "tile", "data-metric": key },
                h("span", { class: "label" }, label), h("span", { class: "value" }, fmt(value))))),
          h("details", {}, h("summary", {}, "Configuration and permissions"),
            table(Object.entries(q.config).map(([k, v]) => ({ k, v })), [["Setting", "k"], ["Value", "v"]]),
            table(Object.entries(q.acl.grants || {}).map(([p, v]) => ({ p, v })), [["Principal", "p"], ["Permissions", "v"]],
              { empty: q.acl.default ? "broker defaults apply" : "no grants" }),
            h("p", {}, `Owner: ${q.acl.owner || "–"}`)),
          writable(h("div", { class: "actions" }, confirmButton("Purge", `Purge ${queueName}?`,
            () => act("purge-queue", { name: queueName }, r => `purged ${r.purged_messages} messages`), { id: "purge-queue" }),
            dropButton)));
      } catch (err) {
        if (err.status !== 401) summary.replaceChildren(h("p", { class: "error" }, refusal(err)));
        return;
      }
      try {
        const page = await api("browse-queue", { name: queueName, offset, limit: PAGE, body_limit: 80 });
        if (page.messages.length === 0 && offset > 0) {
          offset = Math.floor(Math.max(0, page.ready - 1) / PAGE) * PAGE;   // the queue shrank: last page
        }
        browser.replaceChildren(table(page.messages, [
          ["Message id", m => h("a", { href: "#", class: "message-link", onclick: e => { e.preventDefault(); showMessage(m.message_id); } }, m.message_id)],
          ["Seq", "seq"], ["Priority", "priority"], ["Deliveries", "deliveries"], ["Persistent", "persistent"],
          ["Time", m => time(m.timestamp)], ["Size", m => bytes(m.body_size)],
          ["Body", m => ("body" in m ? m.body : "(binary)") + (m.body_truncated ? "…" : ""), { class: "preview" }],
        ], { rowAttrs: m => ({ "data-message-id": m.message_id, class: m.message_id === selected ? "selected" : null }),
          empty: "no ready messages" }));
        const last = page.offset + page.messages.length;
        document.getElementById("page-info").textContent =
          page.messages.length ? `${page.offset + 1}–${last} of ${page.ready}` : `0 of ${page.ready}`;
        document.getElementById("page-prev").disabled = page.offset === 0;
        document.getElementById("page-next").disabled = last >= page.ready;
      } catch (err) {
        if (err.status !== 401) browser.replaceChildren(h("p", { class: "error" }, refusal(err)));
      }
    },
  };
};

/* A page that lists what one read operation returns, or the broker's refusal of it. */
function listPage(id, title, op, render) {
  const body = h("div", { id: `${id}-body` });
  return {
    el: h("section", { class: "page", id: `page-${id}` }, h("h2", {}, title), body),
    async update() {
      try {
        body.replaceChildren(render(await api(op)));
      } catch (err) {
        if (err.status !== 401) body.replaceChildren(h("p", { class: "error refused" }, refusal(err)));
      }
    },
  };
}

pages.topics = () => {
  const page = listPage("topics", "Topics", "list-topics", rows => table(rows, [
    ["Topic", "destination"], ["Vhost", "vhost"], ["Published", "published"], ["In /s", "rate_in"],
    ["Subscriptions", t => t.subscriptions.length], ["Durable", t => t.subscriptions.filter(s => s.durable).length],
  ], { rowAttrs: t => ({ "data-topic": t.name }), empty: "no topics yet" }));
  const form = writable(publishForm(null));
  if (form) page.el.append(form);
  return page;
};

pages.subscriptions = () => listPage("subscriptions", "Subscriptions", "list-subscriptions", rows => table(rows, [
  ["Topic", "topic"], ["Subscription", "name"], ["Durable", "durable"], ["Shared", "shared"], ["Client id", "client_id"],
  ["Depth", "depth"], ["In flight", "in_flight"], ["Consumers", "consumers"], ["Out /s", "rate_out"],
  ["Dead-lettered", "dead_lettered"], ["Selector", "selector"],
], { rowAttrs: s => ({ "data-subscription": s.name }), empty: "no subscriptions" }));

pages.connections = () => listPage("connections", "Connections", "connections", rows => table(rows, [
  ["Id", "id"], ["User", "user"], ["Vhost", "vhost"], ["Peer", "peer"], ["Client id", "client_id"], ["STOMP", "version"],
  ["Subscriptions", "subscriptions"], ["Frames in", "received"], ["Messages out", "sent"],
  ["", c => writable(confirmButton("Close", `Close ${c.id}?`, () => act("close-connection", { id: c.id }, r => `closed ${r.closed}`),
    { class: "close-connection", "data-connection": c.id })), { col: "actions" }],
], { rowAttrs: c => ({ "data-connection": c.id }), empty: "no connections" }));

pages.consumers = () => listPage("consumers", "Consumers", "list-consumers", rows => table(rows, [
  ["Connection", "connection"], ["User", "user"], ["Subscription id", "id"], ["Destination", "destination"],
  ["Queue", "queue"], ["Ack", "ack"], ["Prefetch", "prefetch"], ["In flight", "in_flight"], ["Selector", "selector"],
], { rowAttrs: c => ({ "data-consumer": `${c.connection}/${c.id}` }), empty: "no consumers" }));

pages.dlq = () => listPage("dlq", "Dead-letter queues", "list-dead-letter-queues", rows => table(rows, [
  ["Dead-letter queue", QUEUE_LINK], ["For", "source"], ["Depth", "depth"], ["Consumers", "consumers"], ["Reasons", "reasons"],
  ["", d => writable(h("span", { class: "actions" },
    confirmButton("Retry all", `Retry all to ${d.source}?`, () => act("retry-dead-letters", { name: d.name },
      r => `retried ${r.moved} message(s)${r.more ? "; more are waiting: retry again" : ""}`), { class: "retry-all", "data-queue": d.name }),
    confirmButton("Delete all", `Delete all of ${d.name}?`, () => act("purge-queue", { name: d.name },
      r => `deleted ${r.purged_messages} dead letter(s)`), { class: "purge", "data-queue": d.name }))), { col: "actions" }],
], { rowAttrs: d => ({ "data-queue": d.name }), empty: "no dead letters" }));


/* Users of the users file and the grants on a destination (administrators: the API refuses the rest). */
pages.users = () => {
  const list = h("div", { id: "users-body" });
  const name = h("input", { id: "new-user-name", placeholder: "name", required: true, autocomplete: "off" });
  const password = h("input", { id: "new-user-password", type: "password", required: true, autocomplete: "new-password" });
  const roles = h("input", { id: "new-user-roles", placeholder: "admin, app" });
  const addForm = h("form", { id: "add-user", class: "inline-form", onsubmit: async e => {
    e.preventDefault();
    const r = await act("add-user", { name: name.value, password: password.value, roles: roles.value },
      () => `user ${name.value} added`);
    password.value = "";
    if (r) { name.value = ""; roles.value = ""; }
  } }, h("strong", {}, "Add a user"), h("label", {}, "Name ", name), h("label", {}, "Password ", password),
    h("label", {}, "Roles ", roles), h("button", { type: "submit", id: "add-user-submit" }, "Add"));

  const grantsBody = h("div", { id: "grants-body" });
  const destination = h("input", { id: "grants-destination", placeholder: "/queue/name or /topic/name", required: true });
  const principal = h("input", { id: "grant-principal", placeholder: "user:alice, role:app or *" });
  const perms = ["produce", "consume", "browse", "purge", "create", "manage"].map(p =>
    h("label", { class: "check" }, h("input", { type: "checkbox", value: p, class: "grant-permission", id: `grant-${p}` }), ` ${p}`));
  let shown = null;
  async function showGrants() {
    shown = destination.value;
    try {
      const acl = await api("acl", { destination: shown });
      const rows = Object.entries(acl.grants || {}).map(([p, v]) => ({ principal: p, permissions: v }));
      grantsBody.replaceChildren(h("p", { id: "grants-owner" }, `Owner of ${shown}: ${acl.owner || "–"}`),
        table(rows, [["Principal", "principal"], ["Permissions", "permissions"],
          ["", g => writable(h("span", { class: "actions" }, g.permissions.map(perm => confirmButton(`Revoke ${perm}`,
            `Revoke ${perm} from ${g.principal}?`, () => act("revoke", { destination: shown, principal: g.principal, permissions: [perm] },
              () => `revoked ${perm} on ${shown} from ${g.principal}`).then(showGrants),
            { class: "revoke", "data-principal": g.principal, "data-permission": perm })))), { col: "actions" }]],
        { rowAttrs: g => ({ "data-principal": g.principal }), empty: acl.default ? "broker defaults apply" : "no grants" }));
    } catch (err) {
      if (err.status !== 401) grantsBody.replaceChildren(h("p", { class: "error refused" }, refusal(err)));
    }
  }
  const grantsForm = h("form", { id: "grants-form", class: "inline-form", onsubmit: async e => {
    e.preventDefault();
    const chosen = perms.map(l => l.querySelector("input")).filter(i => i.checked).map(i => i.value);
    if (principal.value && chosen.length) {
      const r = await act("grant", { destination: destination.value, principal: principal.value, permissions: chosen },
        () => `granted ${chosen.join(", ")} on ${destination.value} to ${principal.value}`);
      if (r) for (const l of perms) l.querySelector("input").checked = false;
    }
    await showGrants();
  } }, h("strong", {}, "Grants"), h("label", {}, "Destination ", destination),
    writable(h("span", {}, h("label", {}, "Principal ", principal), ...perms)),
    h("button", { type: "submit", id: "grants-submit" }, state.writer ? "Show / grant" : "Show"));

  return {
    el: h("section", { class: "page", id: "page-users" }, h("h2", {}, "Users"), list, writable(addForm),
      h("h3", {}, "Permissions"), grantsForm, grantsBody),
    async update() {
      let rows;
      try {
        rows = await api("list-users");
      } catch (err) {
        if (err.status !== 401) list.replaceChildren(h("p", { class: "error refused" }, refusal(err)));
        return;
      }
      const editing = document.activeElement;
      if (editing && editing.tagName === "INPUT" && list.contains(editing)) return;   // a roles field being typed in
      list.replaceChildren(table(rows, [
        ["User", "name"], ["Roles", "roles"], ["Loopback only", "loopback_only"],
        ["", u => {
          if (!state.writer) return null;
          const input = h("input", { class: "roles-input", value: u.roles.join(", "), "aria-label": `roles of ${u.name}` });
          return h("span", { class: "actions" }, input,
            h("button", { type: "button", class: "set-roles", onclick: () => act("set-roles", { name: u.name, roles: input.value },
              () => `roles of ${u.name}: ${input.value || "none"}`) }, "Set roles"),
            confirmButton("Remove", `Remove ${u.name}?`, () => act("remove-user", { name: u.name }, () => `user ${u.name} removed`),
              { class: "remove-user" }));
        }, { col: "actions" }],
      ], { rowAttrs: u => ({ "data-user": u.name }), empty: "no users file" }));
    },
  };
};

pages.storage = () => listPage("storage", "Storage devices", "storage", s => {
  const health = (s.rules && s.rules.devices) || {};
  return h("div", {},
    table(s.devices, [
      ["Device", "name"], ["Kind", "kind"], ["Online", "online"], ["Messages", "messages"],
      ["Used", d => bytes(d.bytes_used)], ["Free", d => bytes(d.bytes_free)], ["Errors", "errors"],
      ["Write latency", d => `${(d.write_latency_s * 1000).toFixed(2)} ms`],
      ["Score", d => (health[d.name] ? health[d.name].score : null), { col: "score" }],
      ["Available", d => (health[d.name] ? health[d.name].available : null)],
      ["Why", d => (health[d.name] ? health[d.name].reason : null)],
      ["Persistent", d => d.name === s.persistent_device],
    ], { rowAttrs: d => ({ "data-device": d.name }) }),
    h("h3", {}, "Placements"),
    table(s.placements, [["Device", "device"], ["Rule", "rule"], ["Messages", "messages"], ["Bytes", d => bytes(d.bytes)]],
      { empty: "nothing placed yet" }),
    h("h3", {}, "Rules"),
    s.rules ? table(s.rules.ranking, [["Rule", "id"], ["Device", "device"], ["Weight", "weight"], ["Adjusted", "adjusted"],
      ["Condition", "condition"]], { empty: "no rules" }) : h("p", {}, "Storage rules are not configured (storage.selection)."));
});

pages.cluster = () => {
  const body = h("div", { id: "cluster-body" });
  return {
    el: h("section", { class: "page", id: "page-cluster" }, h("h2", {}, "Cluster"), body),
    async update() {
      let s, outboxes;
      try {
        [s, outboxes] = await Promise.all([api("cluster"), api("list-outboxes")]);
      } catch (err) {
        if (err.status !== 401) body.replaceChildren(h("p", { class: "error refused" }, refusal(err)));
        return;
      }
      body.replaceChildren(
        table(s.members.map(m => ({ node: m, self: m === s.node, link: m === s.node ? null : (s.links[m] ? "up" : "down"),
          outbox: m === s.node ? null : (s.outboxes[m] || 0) })),
        [["Node", "node"], ["This node", "self"], ["Link", "link"], ["Outbox", "outbox"]], { rowAttrs: r => ({ "data-node": r.node }) }),
        h("p", {}, `Forwarded ${fmt(s.forwarded)} · received ${fmt(s.received_forwarded)} · rerouted ${fmt(s.rerouted)} · redistributed ${fmt(s.redistributed)}`),
        h("h3", {}, "Outboxes (what this node holds for each peer)"),
        table(outboxes, [
          ["Peer", "node"], ["State", "state"], ["Held", "held"], ["Messages", "messages"], ["In flight", "in_flight"],
          ["Bytes", o => bytes(o.bytes)], ["Durable subscriptions", "subscriptions"],
          ["", o => (o.held ? confirmButton("Purge", `Drop ${o.messages} held for ${o.node}?`, () => act("purge-outbox",
            { node: o.node }, r => `purged ${r.purged_messages} message(s) held for ${r.node}`),
            { class: "purge-outbox", "data-node": o.node }) : null), { col: "actions" }],
        ], { rowAttrs: o => ({ "data-outbox": o.node }), empty: "no outboxes" }));
    },
  };
};

pages.definitions = () => {
  /* Definitions (spec/admin.md): export the broker's queues, grants, durable subscriptions, users (hashes)
     and storage rules as one JSON document, or import one (applied whole or refused with nothing changed). */
  const exported = h("textarea", { id: "definitions-json", rows: 14, cols: 100, readonly: true });
  const download = h("a", { id: "definitions-download", download: "pymq-definitions.json", hidden: true }, "Download");
  const exportButton = h("button", { type: "button", id: "definitions-export" }, "Export");
  exportButton.addEventListener("click", async () => {
    try {
      const doc = await api("export-definitions");
      const text = JSON.stringify(doc, null, 2);
      exported.value = text;
      if (download.href) URL.revokeObjectURL(download.href);
      download.href = URL.createObjectURL(new Blob([text], { type: "application/json" }));
      download.hidden = false;
      flash(`exported ${doc.queues.length} queue(s), ${doc.permissions.length} access list(s), ` +
            `${doc.durable_subscriptions.length} durable subscription(s), ${doc.users.length} user(s)`, "ok");
    } catch (err) {
      if (err.status !== 401) flash(refusal(err), "error");
    }
  });
  const input = h("textarea", { id: "definitions-import", rows: 10, cols: 100,
                                placeholder: "paste a definitions document (JSON)" });
  const form = h("form", { id: "definitions-import-form", onsubmit: (e) => {
    e.preventDefault();
    act("import-definitions", { definitions: input.value }, r => "imported: " + Object.entries(r)
      .map(([k, v]) => `${k.replace(/_/g, " ")} ${v}`).join(", "));
  } }, input, h("button", { type: "submit", id: "definitions-import-submit" }, "Import"));
  return {
    el: h("section", { class: "page", id: "page-definitions" }, h("h2", {}, "Definitions"),
      h("p", {}, "Queues with their settings, access lists, durable subscriptions, users (password hashes only), " +
                 "storage rules and virtual hosts, as one JSON document."),
      h("div", {}, exportButton, " ", download), exported, h("h3", {}, "Import"), form),
    async update() {},
  };
};

// -- routing and refresh ---------------------------------------------------------------------------
function stopTimer() {
  if (state.timer) clearInterval(state.timer);
  state.timer = null;
}

async function refresh() {
  if (!state.view || state.busy) return;
  state.busy = true;
  try { await state.view.update(); } catch (err) { if (err.status !== 401) flash(refusal(err), "error"); } finally { state.busy = false; }
}

function route() {
  const [, page = "overview", arg] = (location.hash || "#/overview").split("/");
  stopTimer();
  const make = page === "queues" && arg ? () => pages.queue(decodeURIComponent(arg)) : pages[page] || pages.overview;
  state.view = make();
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === page);
  document.getElementById("view").replaceChildren(state.view.el);
  state.busy = false;
  refresh();
  state.timer = setInterval(refresh, 2000);
}

async function start() {
  document.getElementById("login-form").addEventListener("submit", login);
  document.getElementById("logout").addEventListener("click", logout);
  window.addEventListener("hashchange", () => { if (state.csrf) route(); });
  const response = await fetch("/api/session", { credentials: "same-origin" });
  if (response.ok) {
    const body = await response.json();
    enter(body.result);
  } else {
    showLogin("");
  }
}

document.addEventListener("DOMContentLoaded", start);
