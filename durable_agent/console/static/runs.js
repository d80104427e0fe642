// The runs list: the filter and search live in the address (a link or the back button keeps them).
"use strict";

const WAITING = { awaiting_approval: "waits for an approval", awaiting_prompt: "waits for a prompt" };

function row(run) {
  const link = el("a", { href: `/runs/${runPath(run.workflow_id)}` }, run.workflow_id);
  const status = el("span", { className: `badge ${run.status}` }, WAITING[run.status] || run.status);
  const tr = el(
    "tr",
    { className: run.status === "awaiting_approval" ? "waiting" : run.waiting_for_person ? "prompting" : "" },
    el("td", {}, link, run.parent_workflow_id ? el("div", { className: "note" }, "child run") : null),
    el("td", {}, status, run.pending_approvals ? el("div", { className: "note" }, `${run.pending_approvals} call(s) to decide`) : null),
    el("td", { className: "summary" }, run.summary || ""),
    el("td", {}, run.model || ""),
    el("td", { title: new Date(run.started_ms).toISOString() }, age(run.started_ms)),
    el("td", { className: "num" }, run.total_tokens === null ? "" : run.total_tokens.toLocaleString()),
    el("td", { className: "num" }, money(run.cost_usd)),
  );
  tr.dataset.workflowId = run.workflow_id;
  return tr;
}

async function load() {
  const params = new URLSearchParams(location.search);
  const message = document.getElementById("message");
  try {
    const data = await api(`/api/runs?${params.toString()}`);
    const body = document.querySelector("#runs tbody");
    fill(body, data.runs.map(row));
    message.textContent = data.runs.length ? "" : "no runs match";
  } catch (e) {
    message.textContent = e.message;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const params = new URLSearchParams(location.search);
  document.getElementById("status").value = params.get("status") || "";
  document.getElementById("q").value = params.get("q") || "";
  showInfo();
  load();
  setInterval(load, 5000);
});
