// The Danube web console: plain JavaScript, no build step, no CDN. Every call goes to the
// console's JSON API (/api/tools/<name>), which runs the same danube-admin commands as the
// CLI and the MCP server; errors are shown as the CLI's one-line message.
"use strict";

const POLL_MS = 2000;
const HISTORY = 60;
let timers = [];
let namespace = "default";

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null) el.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function svg(tag, attrs) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, value);
  return el;
}

async function call(name, args) {
  const reply = await fetch(`/api/tools/${name}`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-danube-console": "1" },
    body: JSON.stringify(args || {}),
  });
  const body = await reply.json();
  if (!reply.ok) throw new Error(body.error || `${name}: HTTP ${reply.status}`);
  return body.data;
}

// A topic being (re)assigned answers UNAVAILABLE "... retry shortly": retry for a few seconds.
async function callSettled(name, args) {
  for (let attempt = 0; ; attempt++) {
    try {
      return await call(name, args);
    } catch (error) {
      if (attempt >= 20 || !/UNAVAILABLE/.test(error.message)) throw error;
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
  }
}

function showError(error) {
  const box = document.getElementById("error");
  box.textContent = error instanceof Error ? error.message : String(error);
  box.hidden = false;
}

function notice(text) {
  const box = document.getElementById("notice");
  box.textContent = text;
  box.hidden = false;
}

function clearMessages() {
  document.getElementById("error").hidden = true;
  document.getElementById("notice").hidden = true;
}

function confirmAction(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

async function action(text, name, args, after) {
  clearMessages();
  if (text && !(await confirmAction(text))) return;
  try {
    const data = await call(name, args);
    notice(`${name}: done`);
    if (after) await after(data);
  } catch (error) {
    showError(error);
  }
}

function table(id, headers, rows) {
  return h("table", { id }, h("thead", {}, h("tr", {}, headers.map((t) => h("th", {}, t)))),
    h("tbody", {}, rows));
}

function card(label, value, id) {
  return h("div", { class: "card" }, h("div", { class: "value", id }, value), h("div", { class: "label" }, label));
}

function setPage(...children) {
  const page = document.getElementById("page");
  page.replaceChildren(...children);
  return page;
}

// ---- cluster overview -------------------------------------------------------------------
async function overview() {
  const [brokers, leader, balance] = await Promise.all([
    call("list_brokers"), call("get_leader"), call("get_cluster_balance"),
  ]);
  const loads = new Map(balance.brokers.map((b) => [String(b.broker_id), b]));
  const rows = brokers.brokers.map((b) => {
    const load = loads.get(b.broker_id) || {};
    return h("tr", { class: "broker", "data-broker-id": b.broker_id },
      h("td", {}, b.broker_id),
      h("td", { class: b.broker_status === "active" ? "status-active" : "status-other" }, b.broker_status),
      h("td", {}, b.broker_id === leader.leader ? "leader" : b.broker_role),
      h("td", {}, b.broker_addr), h("td", {}, b.admin_addr),
      h("td", { class: "topic-count" }, load.topic_count ?? ""),
      h("td", {}, load.load ?? ""),
      h("td", {}, b.broker_status === "active"
        ? h("button", {
          class: "danger drain", onclick: () => action(
            `Drain broker ${b.broker_id}: unload all its topics to the other brokers?`,
            "unload_broker", { broker_id: b.broker_id }, () => route()),
        }, "Drain")
        : h("button", {
          class: "activate", onclick: () => action(null, "activate_broker",
            { broker_id: b.broker_id, reason: "activated from the web console" }, () => route()),
        }, "Activate")));
  });
  const rebalanceOut = h("pre", { id: "rebalance-result", hidden: "" });
  setPage(
    h("h2", {}, "Cluster"),
    h("div", { class: "cards" },
      card("brokers", brokers.brokers.length, "broker-count"),
      card("leader", leader.leader, "leader"),
      card("coefficient of variation", balance.coefficient_of_variation.toFixed(3), "balance-cv"),
      card("assignment", balance.assignment_strategy, "assignment")),
    table("brokers", ["broker id", "status", "role", "client address", "admin address", "topics", "load", ""], rows),
    h("div", { class: "toolbar" },
      h("button", {
        id: "rebalance-dry-run", onclick: () => action(null, "trigger_rebalance", { dry_run: true }, (data) => {
          rebalanceOut.textContent = JSON.stringify(data, null, 1);
          rebalanceOut.hidden = false;
        }),
      }, "Rebalance (dry run)")),
    rebalanceOut);
}

// ---- topics -----------------------------------------------------------------------------
async function namespacePicker(onchange) {
  const data = await call("list_namespaces");
  if (!data.namespaces.includes(namespace) && data.namespaces.length) namespace = data.namespaces[0];
  const select = h("select", { id: "namespace", onchange: (e) => { namespace = e.target.value; onchange(); } },
    data.namespaces.map((n) => h("option", n === namespace ? { value: n, selected: "" } : { value: n }, n)));
  return h("label", {}, "namespace ", select);
}

function sparkline(id, cls, values) {
  const width = 320, height = 70;
  const chart = svg("svg", { id, class: `spark ${cls}`, width, height, viewBox: `0 0 ${width} ${height}` });
  const max = Math.max(1, ...values) * 1.25;  // headroom: a steady rate is not a line on the edge
  // the line fills the chart from the first poll on, and scrolls once HISTORY polls are kept
  const step = width / Math.max(9, values.length - 1);
  const points = values.map((v, i) => `${i * step},${height - 4 - (v / max) * (height - 8)}`);
  chart.append(svg("polyline", { points: points.join(" ") }));
  return chart;
}

function chartBox(label, id, cls, values, unit) {
  const now = values.length ? values[values.length - 1] : 0;
  return h("div", { class: "chart" },
    h("div", { class: "label" }, label, ": ", h("span", { class: "now", id: `${id}-now` }, `${now.toFixed(1)} ${unit}`)),
    sparkline(id, cls, values));
}

async function topicDetail(name, box) {
  timers.forEach(clearInterval);
  timers = [];
  const [info, subs] = await Promise.all([
    callSettled("describe_topic", { topic: name }), callSettled("list_subscriptions", { topic: name }),
  ]);
  const charts = h("div", { class: "charts", id: "charts" });
  const subTable = h("tbody", {});
  box.replaceChildren(
    h("h3", {}, name),
    h("div", { class: "toolbar" },
      h("span", {}, "broker ", h("b", { id: "topic-broker" }, info.broker_id)),
      h("span", {}, "delivery ", info.delivery),
      h("span", {}, "schema ", info.schema_subject ?? "none"),
      h("button", {
        id: "unload-topic", class: "danger",
        onclick: () => action(`Unload ${name}? Its broker gives it up and another takes it.`,
          "unload_topic", { topic: name }, () => topicDetail(name, box)),
      }, "Unload"),
      h("button", {
        id: "delete-topic", class: "danger",
        onclick: () => action(`Delete topic ${name} and all its messages? This cannot be undone.`,
          "delete_topic", { topic: name }, () => route()),
      }, "Delete")),
    charts,
    h("h4", {}, "Subscriptions"),
    h("table", { id: "topic-subscriptions" },
      h("thead", {}, h("tr", {}, ["subscription", "dispatched", "backlog (estimate)"].map((t) => h("th", {}, t)))),
      subTable),
    h("h4", {}, "Replication"),
    h("pre", {}, JSON.stringify(info.replication, null, 1)));
  const history = { rate: [], backlog: [] };
  let last = null;
  async function poll() {
    try {
      const r = await fetch(`/api/topic-series?topic=${encodeURIComponent(name)}`);
      const body = await r.json();
      if (!r.ok) throw new Error(body.error);
      const s = body.data, t = performance.now();
      if (last) history.rate.push(Math.max(0, (s.messages_in - last.messages_in) / ((t - last.t) / 1000)));
      const backlog = Object.values(s.backlog_estimate).reduce((a, b) => a + b, 0);
      history.backlog.push(backlog);
      for (const k of ["rate", "backlog"]) if (history[k].length > HISTORY) history[k].shift();
      last = { ...s, t };
      charts.replaceChildren(
        chartBox("publish rate", "rate-chart", "rate", history.rate, "msg/s"),
        chartBox("backlog (all subscriptions)", "backlog-chart", "backlog", history.backlog, "msgs"),
        h("div", { class: "chart" }, h("div", { class: "label" }, "totals"),
          h("div", {}, `in ${s.messages_in} msgs, ${s.bytes_in} bytes`),
          h("div", {}, `${s.producers} producers, ${s.consumers} consumers`)));
      subTable.replaceChildren(...subs.subscriptions.map((sub) => h("tr", { class: "subscription" },
        h("td", {}, sub), h("td", {}, s.messages_out[sub] ?? 0), h("td", {}, s.backlog_estimate[sub] ?? 0))));
    } catch (error) {
      showError(error);
    }
  }
  await poll();
  timers.push(setInterval(poll, POLL_MS));
}

async function topics() {
  const picker = await namespacePicker(route);
  const data = await call("list_topics", { namespace });
  const detail = h("div", { id: "topic-detail" });
  const rows = data.topics.map((t) => h("tr", {
    class: "topic clickable", "data-topic": t.name,
    onclick: (e) => {
      for (const tr of document.querySelectorAll("tr.topic")) tr.classList.remove("selected");
      e.currentTarget.classList.add("selected");
      topicDetail(t.name, detail).catch(showError);
    },
  }, h("td", {}, t.name), h("td", {}, t.broker_id), h("td", {}, t.delivery)));
  setPage(h("h2", {}, "Topics"), h("div", { class: "toolbar" }, picker,
    h("span", { class: "muted", id: "topic-count" }, `${data.topics.length} topics`)),
    table("topics", ["topic", "broker", "delivery"], rows), detail);
}

// ---- subscriptions ----------------------------------------------------------------------
async function subscriptions() {
  const picker = await namespacePicker(route);
  const data = await call("list_topics", { namespace });
  const lists = await Promise.all(data.topics.map((t) => call("list_subscriptions", { topic: t.name })
    .then((s) => s.subscriptions.map((sub) => [t.name, sub]), () => [])));
  const rows = lists.flat().map(([topic, sub]) => h("tr", { class: "subscription" },
    h("td", {}, topic), h("td", {}, sub),
    h("td", {}, h("button", {
      class: "danger", onclick: () => action(`Remove subscription ${sub} from ${topic}?`,
        "unsubscribe", { topic, subscription: sub }, () => route()),
    }, "Unsubscribe"))));
  setPage(h("h2", {}, "Subscriptions"), h("div", { class: "toolbar" }, picker),
    table("subscriptions", ["topic", "subscription", ""], rows));
}

// ---- schemas ----------------------------------------------------------------------------
async function schemaDetail(subject, box) {
  const [versions, latest] = await Promise.all([
    call("list_schema_versions", { subject }), call("get_schema", { subject }),
  ]);
  const definition = h("pre", { id: "schema-definition" }, latest.schema_definition);
  const rows = versions.versions.map((v) => h("tr", {
    class: "schema-version clickable", onclick: async () => {
      try { definition.textContent = (await call("get_schema", { id: v.schema_id, version: v.version })).schema_definition; }
      catch (error) { showError(error); }
    },
  }, h("td", {}, v.version), h("td", {}, v.schema_id), h("td", {}, new Date(v.created_at * 1000).toISOString()),
    h("td", {}, v.created_by), h("td", {}, v.fingerprint)));
  box.replaceChildren(h("h3", {}, subject),
    table("schema-versions", ["version", "schema id", "created", "by", "fingerprint"], rows),
    h("div", { class: "muted" }, `${latest.schema_type}, compatibility ${latest.compatibility_mode}; latest version ${latest.version}`),
    definition);
}

async function schemas() {
  const data = await call("list_subjects");
  const detail = h("div", { id: "schema-detail" });
  const rows = data.subjects.map((s) => h("tr", {
    class: "subject clickable", "data-subject": s.subject,
    onclick: () => schemaDetail(s.subject, detail).catch(showError),
  }, h("td", {}, s.subject), h("td", {}, s.schema_type), h("td", {}, s.latest_version),
    h("td", {}, s.compatibility_mode), h("td", {}, (s.tags || []).join(", "))));
  setPage(h("h2", {}, "Schemas"),
    table("subjects", ["subject", "type", "latest version", "compatibility", "tags"], rows), detail);
}

// ---- namespaces -------------------------------------------------------------------------
async function namespaces() {
  const data = await call("list_namespaces");
  const policies = await Promise.all(data.namespaces.map((n) => call("get_namespace_policies", { namespace: n })));
  const keys = policies.length ? Object.keys(policies[0]).sort() : [];
  const rows = data.namespaces.map((n, i) => h("tr", { class: "namespace", "data-namespace": n },
    h("td", {}, n), keys.map((k) => h("td", {}, policies[i][k]))));
  setPage(h("h2", {}, "Namespaces and their policies"),
    h("p", { class: "muted" }, "0 means unlimited."),
    table("namespaces", ["namespace", ...keys], rows));
}

// ---- routing ----------------------------------------------------------------------------
const PAGES = { overview, topics, subscriptions, schemas, namespaces };

async function route() {
  timers.forEach(clearInterval);
  timers = [];
  const name = (location.hash.replace(/^#\//, "") || "overview").split("/")[0];
  const page = PAGES[name] || overview;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === name);
  document.getElementById("error").hidden = true;
  try {
    await page();
    document.getElementById("page").dataset.loaded = name;
  } catch (error) {
    showError(error);
  }
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", async () => {
  try {
    const info = await (await fetch("/api/tools")).json();
    document.getElementById("endpoint").textContent = `admin endpoint ${info.endpoint}`;
  } catch (error) {
    showError(error);
  }
  route();
});
