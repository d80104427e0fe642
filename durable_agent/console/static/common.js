// What the console's pages share: the API with its CSRF header, elements made with text only
// (a model's output is never read as HTML), and the header's facts.
"use strict";

const CSRF_COOKIE = "durable_console_csrf";

function csrfToken() {
  for (const part of document.cookie.split(";")) {
    const [name, ...rest] = part.trim().split("=");
    if (name === CSRF_COOKIE) return rest.join("=");
  }
  return "";
}

// fetch an API path; the answer's JSON, or an Error whose message is the API's own
async function api(path, body) {
  const options = { credentials: "same-origin", headers: { Accept: "application/json" } };
  if (body !== undefined) {
    options.method = "POST";
    options.headers["Content-Type"] = "application/json";
    options.headers["X-CSRF-Token"] = csrfToken();
    options.body = JSON.stringify(body);
  }
  const response = await fetch(path, options);
  let data = {};
  try { data = await response.json(); } catch (e) { data = { error: response.statusText }; }
  if (!response.ok) {
    const error = new Error(data.error || `${response.status} ${response.statusText}`);
    error.status = response.status;
    throw error;
  }
  return data;
}

// an element with attributes and children: strings become text nodes, never markup
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "className") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// replace a node's children: strings as text, nothing for null, undefined or false
function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false)
    .map((c) => (c instanceof Node ? c : document.createTextNode(String(c)))));
  return node;
}

// a run's path: a child's workflow id holds "/", each part encoded
function runPath(workflowId) {
  return workflowId.split("/").map(encodeURIComponent).join("/");
}

function age(ms) {
  if (!ms) return "";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

function money(value) {
  return value === null || value === undefined ? "" : `$${Number(value).toFixed(4)}`;
}

async function showInfo() {
  try {
    const info = await api("/api/info");
    document.getElementById("where").textContent = `task queue ${info.task_queue} · namespace ${info.namespace}`;
    document.getElementById("codec").textContent = info.codec;
    return info;
  } catch (e) {
    document.getElementById("where").textContent = e.message;
    return null;
  }
}
