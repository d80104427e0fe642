// A run: its conversation as it happens (server-sent events), what a person can do, its files.
// Everything a run or its model wrote is put in the page as text (textContent), never as HTML.
"use strict";

const FOLD_CHARS = 600;
const page = (() => {
  const rest = location.pathname.replace(/^\/runs\//, "");
  const turn = rest.match(/\/turns\/(\d+)$/);
  const id = rest.replace(/\/turns\/\d+$/, "").split("/").map(decodeURIComponent).join("/");
  return { id, turn: turn ? Number(turn[1]) : null, base: `/api/runs/${runPath(id)}` };
})();
const seen = { last: 0, markers: [], offset: null, stream: null, view: null, exports: new Map() };

function say(text, failed) {
  const out = document.getElementById("outcome");
  out.textContent = text;
  out.className = failed ? "message error" : "message";
}

// long text folded: its first line shows, the rest opens on a click
function folded(label, text, className) {
  if (text.length <= FOLD_CHARS && text.split("\n").length <= 12) {
    return el("div", { className }, el("span", { className: "label" }, label), el("pre", {}, text));
  }
  return el("details", { className }, el("summary", {}, `${label} (${text.length.toLocaleString()} characters)`), el("pre", {}, text));
}

// a boundary's marker: numbered once a turn_end says which turn the run is at (the events a page
// reads may start in the middle of a run), its link, diff and rewind then usable
function boundary() {
  const link = el("a", {}, "boundary …");
  const diffBox = el("div", { className: "diff" });
  const show = el("button", { type: "button", disabled: true, onclick: () => showDiff(Number(mark.dataset.turn), diffBox) }, "diff");
  const back = el("button", { type: "button", className: "danger", disabled: true, onclick: () => rewind(Number(mark.dataset.turn)) }, "rewind to here");
  const mark = el("li", { className: "boundary" }, link, " ", show, " ", back, diffBox);
  seen.markers.push(mark);
  if (seen.offset !== null) number(mark, seen.offset + seen.markers.length);
  return mark;
}

function number(mark, turn) {
  mark.id = `turn-${turn}`;
  mark.dataset.turn = turn;
  const link = mark.querySelector("a");
  link.textContent = `boundary ${turn}`;
  link.href = `/runs/${runPath(page.id)}/turns/${turn}`;
  for (const button of mark.querySelectorAll("button")) button.disabled = false;
}

function render(record) {
  const e = record.event;
  const li = (cls, ...children) => el("li", { className: `ev ${cls}`, dataset: { sequence: record.sequence } }, ...children);
  switch (e.type) {
    case "run_start":
      return [li("user", el("span", { className: "label" }, "prompt"), el("pre", {}, e.prompt), el("div", { className: "note" }, `model ${e.model}${e.resumed_from ? ` · resumed from ${e.resumed_from}` : ""}`))];
    case "user_message":
      return [li("user", el("span", { className: "label" }, e.kind.replace("_", " ")), el("pre", {}, e.text))];
    case "text_delta":
      document.getElementById("live").hidden = true;
      document.getElementById("live-thinking").hidden = true;
      return [li("assistant", el("pre", {}, e.text))];
    case "thinking":
      return [li("thinking", el("details", {}, el("summary", {}, "thinking"), el("pre", {}, e.text)))];
    case "tool_start":
      return [li("tool", el("span", { className: "label" }, `${e.name} ${e.id}`), folded("arguments", JSON.stringify(e.input, null, 2), "args"))];
    case "tool_end":
      return [
        li(e.is_error ? "tool-out error" : "tool-out", folded(`${e.name} output${e.is_error ? " (error)" : ""}`, e.output + (e.output_chars > e.output.length ? `\n…[${e.output_chars - e.output.length} more characters]` : ""), "out")),
        boundary(),
      ];
    case "confirmation_required":
      return [li("ask", `${e.name} ${e.id} waits for a person's approval: ${e.arguments}`)];
    case "confirmation_received":
      return [li("ask", `${e.name} ${e.id} ${e.approved ? "approved" : "denied"}${e.timed_out ? " (timed out)" : ""}${e.reason ? `: ${e.reason}` : ""}`)];
    case "permission_denied":
      return [li("error", `${e.name} ${e.id} refused: ${e.reason}`)];
    case "error":
      return [li("error", e.message)];
    case "end":
      return [li(`end ${e.status}`, el("span", { className: "label" }, `run ${e.status}`), e.text ? el("pre", {}, e.text) : null)];
    case "todo":
      showTodos(e.todos || []);
      return [];
    case "checkpoint_exported":
      seen.exports.set(e.turn, e.content_digest);  // the list is redrawn once the batch is in
      return [li("note", `export of turn ${e.turn}: ${e.content_digest}`)];
    case "subagent_start":
      return [li("note", "child run ", el("a", { href: `/runs/${runPath(e.workflow_id)}` }, e.workflow_id), ` started: ${e.description || ""}`)];
    case "subagent_end":
      return [li("note", "child run ", el("a", { href: `/runs/${runPath(e.workflow_id)}` }, e.workflow_id), ` ended ${e.status || ""}`)];
    case "turn_end": {
      // the run's turn after its last call: every marker's number follows from it (renumbered
      // only when that changes: a thousand boundaries must not mean a million renumberings)
      const offset = e.turn - seen.markers.length;
      if (offset !== seen.offset) {
        seen.offset = offset;
        seen.markers.forEach((mark, i) => number(mark, offset + i + 1));
      }
      return [];
    }
    case "model_usage":
      return [];
    default:
      return [li("note", `${e.type}: ${JSON.stringify(e)}`)];
  }
}

function addEvents(records) {
  const batch = document.createDocumentFragment();  // one layout for a run of a thousand boundaries
  for (const record of records) {
    if (record.sequence <= seen.last) continue;
    seen.last = record.sequence;
    batch.append(...render(record));
  }
  document.getElementById("conversation").append(batch);
  showExports();
}

function showTodos(items) {
  const marks = { completed: "☑", in_progress: "▶", pending: "☐" };
  fill(document.getElementById("todos"), ...items.map((t) => el("li", { className: t.status }, `${marks[t.status] || ""} ${t.content}`)));
}

function showExports() {
  const rows = [...seen.exports.entries()].sort((a, b) => a[0] - b[0]).map(([turn, digest]) =>
    el("li", {}, el("a", { href: `${page.base}/exports/${turn}`, download: `turn-${turn}.json` }, `turn ${turn}`), " ", el("code", {}, digest)));
  fill(document.getElementById("exports"), ...rows);
}

async function childTree(children, depth) {
  const items = [];
  for (const c of children) {
    const item = el("li", {}, el("a", { href: `/runs/${runPath(c.workflow_id)}` }, c.description || c.workflow_id), ` · ${c.status}`, c.agent_type ? ` · ${c.agent_type}` : "");
    if (depth < 3) {
      try {
        const sub = await api(`/api/runs/${runPath(c.workflow_id)}`);
        const grand = (sub.status && sub.status.children) || [];
        if (grand.length) item.append(el("ul", {}, ...(await childTree(grand, depth + 1))));
      } catch (e) { /* a child no worker answers for: shown without its own children */ }
    }
    items.push(item);
  }
  return items;
}

function showApprovals(pending) {
  const box = document.getElementById("approvals");
  fill(box, ...pending.map((p) => {
    const reason = el("input", { name: "reason", placeholder: "reason (optional)" });
    const decide = (approved) => act("approve", { call_id: p.call_id, approved, reason: reason.value || null, arguments_digest: p.arguments_digest || null });
    return el("div", { className: "approval", dataset: { callId: p.call_id } },
      el("div", { className: "label" }, `${p.tool}${p.target ? ` ${p.target}` : ""} waits for you`),
      el("pre", {}, p.arguments),
      el("div", { className: "note" }, `call ${p.call_id} · step ${p.step} · ${p.arguments_digest}`),
      reason,
      el("button", { type: "button", className: "approve", onclick: () => decide(true) }, "Approve"),
      el("button", { type: "button", className: "deny danger", onclick: () => decide(false) }, "Deny"));
  }));
}

async function refresh() {
  let view;
  try {
    view = await api(page.base);
  } catch (e) {
    say(e.message, true);
    return;
  }
  seen.view = view;
  const s = view.status || {};
  const r = view.result || {};
  document.title = `${view.summary || page.id} · durable-agent console`;
  document.getElementById("summary").textContent = view.summary || page.id;
  document.getElementById("ids").textContent = `${page.id} · run ${view.run_id}${s.session_id ? ` · session ${s.session_id}` : ""}`;
  const state = s.status || r.status || view.execution_status.toLowerCase();
  const usage = s.usage || r.usage || {};
  fill(document.getElementById("facts"), 
    el("span", { className: `badge ${state}`, id: "state" }, state), " ",
    s.model ? `model ${s.model} · ` : "",
    `${(usage.total_tokens || 0).toLocaleString()} tokens`,
    s.cost_usd !== undefined && s.cost_usd !== null ? ` · ${money(s.cost_usd)}` : "",
    s.turn ? ` · turn ${s.turn}` : "",
    view.failure ? el("div", { className: "error" }, view.failure) : null,
    s.error || r.error ? el("div", { className: "error" }, s.error || r.error) : null);
  fill(document.getElementById("links"), 
    el("a", { href: "/" }, "all runs"), " · ",
    el("a", { href: view.temporal_ui, target: "_blank", rel: "noopener" }, "in the Temporal UI"),
    view.parent_workflow_id || s.parent_workflow_id ? [" · ", el("a", { href: `/runs/${runPath(view.parent_workflow_id || s.parent_workflow_id)}` }, "parent run")] : "");
  showApprovals(view.running ? s.pending_approvals || [] : []);
  document.getElementById("prompt-form").hidden = !(view.running && s.status === "awaiting_prompt");
  document.getElementById("steer-form").hidden = !(view.running && s.status && s.status !== "awaiting_prompt");
  document.getElementById("cancel-form").hidden = !view.running;
  document.getElementById("end-form").hidden = !view.running;
  if (s.todos) showTodos(s.todos);
  fill(document.getElementById("budgets"), ...(s.budgets || []).map((b) => el("li", {}, `${b.budget}: ${b.budget === "cost" ? money(b.used) : b.used.toLocaleString()} of ${b.budget === "cost" ? money(b.limit) : b.limit.toLocaleString()}`)));
  if (!(s.budgets || []).length) fill(document.getElementById("budgets"), el("li", { className: "note" }, "none set"));
  for (const x of view.exports || []) seen.exports.set(x.turn, x.content_digest);
  showExports();
  const children = s.children || [];
  fill(document.getElementById("children"), ...(children.length ? await childTree(children, 1) : [el("li", { className: "note" }, "none")]));
}

async function act(name, body) {
  say(`${name}…`);
  const before = seen.view && seen.view.run_id;
  let rewound = false;  // this run rewound itself: it goes on as a new execution
  try {
    const answer = await api(`${page.base}/${name}`, body);
    rewound = name === "rewind" && answer.workflow_id === page.id;
    say(answer.outcome || `${name}: ${JSON.stringify(answer)}`);
    if (answer.workflow_id && answer.workflow_id !== page.id) {
      document.getElementById("outcome").append(" ", el("a", { href: `/runs/${runPath(answer.workflow_id)}` }, "open the new run"));
    }
  } catch (e) {
    say(`${name}: ${e.message}`, true);
  }
  await refresh();
  if (rewound) {
    // the run goes on as a new execution whose events are its own: once it has started, read
    // them again from its start
    for (let i = 0; i < 40 && seen.view && seen.view.run_id === before; i++) {
      await new Promise((resolve) => setTimeout(resolve, 250));
      await refresh();
    }
    seen.last = 0;
    seen.markers = [];
    seen.offset = null;
    seen.exports.clear();
    fill(document.getElementById("conversation"));
    await loadEvents();
    follow(true);
  }
}

async function loadEvents(reading) {
  try {
    addEvents((await (reading || api(`${page.base}/events?after=0`))).events);
  } catch (e) {
    say(`events: ${e.message}`, true);
  }
}

function showDiffInto(box, d) {
  const lines = d.diff.split("\n").map((line) => {
    const cls = line.startsWith("+") && !line.startsWith("+++") ? "add" : line.startsWith("-") && !line.startsWith("---") ? "del" : line.startsWith("@@") ? "hunk" : "";
    return el("span", { className: cls }, `${line}\n`);
  });
  fill(box, 
    d.note ? el("p", { className: "note" }, d.note) : null,
    d.files.length ? el("ul", { className: "stat" }, ...d.files.map((f) => el("li", {}, `${f.added === null ? "binary" : `+${f.added} -${f.deleted}`}  ${f.path}`))) : null,
    d.diff ? el("pre", { className: "patch" }, ...lines) : null,
    d.truncated ? el("p", { className: "note" }, "the rest is left out: durable-agent diff shows it all") : null);
}

async function showDiff(turn, box) {
  box.textContent = "reading the diff…";
  try {
    showDiffInto(box, await api(`${page.base}/diff?turn=${turn}`));
  } catch (e) {
    fill(box, el("p", { className: "error" }, e.message));
  }
}

async function rewind(turn) {
  const view = seen.view || {};
  const waiting = view.running && view.status && view.status.status === "awaiting_prompt";
  const what = waiting
    ? "The run goes back to this boundary: its files are restored and it goes on from there."
    : "The run's workspace is rebuilt on this machine as it was at this boundary, and a new run goes on from there.";
  // the confirmation, and the message the run takes up again with (empty: none)
  const message = window.prompt(`Rewind to boundary ${turn}?\n\n${what}\n\nA message for the run (optional):`, "");
  if (message === null) return;
  const body = message.trim() ? { turn, prompt: message.trim() } : { turn };
  await act("rewind", body);
}

function follow(restart) {
  if (seen.stream && !restart) return;
  if (seen.stream) seen.stream.close();
  const stream = new EventSource(`${page.base}/events/stream?after=${seen.last}`);
  seen.stream = stream;
  let pending = null;
  stream.addEventListener("event", (m) => {
    addEvents([JSON.parse(m.data)]);
    clearTimeout(pending);
    pending = setTimeout(refresh, 300);
  });
  stream.addEventListener("live", (m) => {
    // the model's answer while it streams, and its thinking (folded, never shown as the answer)
    const data = JSON.parse(m.data);
    const thinking = document.getElementById("live-thinking");
    thinking.querySelector("pre").textContent = data.thinking || "";
    thinking.hidden = !data.thinking;
    const live = document.getElementById("live");
    live.textContent = data.text || "";
    live.hidden = !data.text;
  });
  stream.addEventListener("closed", () => { stream.close(); seen.stream = null; refresh(); });
}

function wireForms() {
  for (const name of ["prompt", "steer", "cancel", "end"]) {
    document.getElementById(`${name}-form`).addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const form = ev.target;
      const data = Object.fromEntries(new FormData(form).entries());
      if (name === "cancel" && !window.confirm("Cancel this run?")) return;
      if (name === "cancel" && !data.reason) delete data.reason;
      await act(name, name === "end" ? {} : data);
      form.reset();
    });
  }
  document.getElementById("whole").addEventListener("click", async () => {
    const box = document.getElementById("whole-diff");
    box.textContent = "reading the diff…";
    try { showDiffInto(box, await api(`${page.base}/diff`)); } catch (e) { fill(box, el("p", { className: "error" }, e.message)); }
  });
}

document.addEventListener("DOMContentLoaded", async () => {
  wireForms();
  showInfo();
  const reading = api(`${page.base}/events?after=0`);  // read while the run's view is
  reading.catch(() => {});
  await refresh();
  performance.mark("console:view");  // the page's phases, for bench/console_cost.py
  const read = await reading.catch(() => null);
  performance.mark("console:events");
  await loadEvents(read ? Promise.resolve(read) : undefined);
  performance.mark("console:rendered");
  if (page.turn !== null) {
    const mark = document.getElementById(`turn-${page.turn}`);
    if (mark) {
      mark.classList.add("focused");
      mark.scrollIntoView({ block: "center" });
      showDiff(page.turn, mark.querySelector(".diff"));
    } else {
      say(`this run has no boundary ${page.turn} (yet)`, true);
    }
  }
  if (seen.view && seen.view.running) follow(false);
  setInterval(() => { if (seen.view && seen.view.running) { refresh(); follow(false); } }, 4000);
});
