// The auditors' review page: reads the JSON audit API with the key the auditor pastes.
// Record fields are untrusted text (prompts, answers): they are only ever set through
// textContent, never parsed as HTML.
"use strict";

const KEY_STORAGE = "bastion.auditorKey";
const PAGE_SIZE = 50;
const DETAIL_FIELDS = [
  "seq", "created_at", "event", "request_id", "endpoint", "tenant", "key_id", "end_user",
  "policy_version", "model", "outcome", "status_code", "error_code", "chunk_ids",
  "prompt_tokens", "completion_tokens", "latency_ms", "engine_ms", "prompt_sha256",
  "answer_sha256", "prev_hash", "record_hash",
];

const $ = (id) => document.getElementById(id);
let nextCursor = null;
let query = new URLSearchParams();

function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE) || "";
}

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

async function api(path, params) {
  const url = params && [...params].length ? `${path}?${params}` : path;
  const response = await fetch(url, { headers: { authorization: `Bearer ${apiKey()}` } });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const message = body && body.error ? body.error.message : response.statusText;
    throw new Error(`${response.status}: ${message}`);
  }
  return body;
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function verdictSummary(verdicts) {
  return (verdicts || [])
    .filter((v) => v.action !== "allow")
    .map((v) => `${v.check}: ${v.action} ${Number(v.score).toFixed(2)}`)
    .join(", ");
}

function addRows(records) {
  const tbody = $("records").tBodies[0];
  for (const record of records) {
    const tr = document.createElement("tr");
    tr.dataset.seq = String(record.seq);
    cell(tr, record.seq);
    cell(tr, (record.created_at || "").replace("T", " ").slice(0, 19));
    cell(tr, record.event);
    cell(tr, record.outcome, `outcome-${record.outcome}`);
    cell(tr, record.end_user);
    cell(tr, (record.policy_version || "").slice(0, 12)).title = record.policy_version || "";
    cell(tr, verdictSummary(record.verdicts));
    tr.addEventListener("click", () => showDetail(record.seq, tr));
    tbody.appendChild(tr);
  }
}

function filterParams() {
  const params = new URLSearchParams();
  const form = new FormData($("filters"));
  for (const [name, value] of form.entries()) {
    const text = String(value).trim();
    if (!text) continue;
    // datetime-local has no zone: read it as the browser's local time, send it as UTC.
    params.set(name, name === "since" || name === "until" ? new Date(text).toISOString() : text);
  }
  return params;
}

async function loadPage(reset) {
  if (!apiKey()) {
    setStatus("Paste an auditor API key first.", true);
    return;
  }
  if (reset) {
    query = filterParams();
    nextCursor = null;
    $("records").tBodies[0].replaceChildren();
    $("detail").hidden = true;
  }
  const params = new URLSearchParams(query);
  params.set("limit", String(PAGE_SIZE));
  if (nextCursor !== null) params.set("cursor", String(nextCursor));
  setStatus("Loading…");
  try {
    const page = await api("/audit/records", params);
    addRows(page.data);
    nextCursor = page.next_cursor;
    $("more").hidden = nextCursor === null;
    const shown = $("records").tBodies[0].rows.length;
    setStatus(`${shown} record${shown === 1 ? "" : "s"} shown${nextCursor === null ? "" : " (more available)"}.`);
  } catch (error) {
    setStatus(`Could not load records: ${error.message}`, true);
  }
}

async function showDetail(seq, tr) {
  for (const row of $("records").tBodies[0].rows) row.classList.remove("selected");
  tr.classList.add("selected");
  try {
    const record = await api(`/audit/records/${encodeURIComponent(seq)}`);
    $("detail-title").textContent = `Record ${record.seq}`;
    const fields = $("detail-fields");
    fields.replaceChildren();
    for (const name of DETAIL_FIELDS) {
      const dt = document.createElement("dt");
      dt.textContent = name;
      const dd = document.createElement("dd");
      const value = record[name];
      dd.textContent = value === null || value === undefined ? "—"
        : typeof value === "object" ? JSON.stringify(value) : String(value);
      fields.append(dt, dd);
    }
    const tbody = $("detail-verdicts").tBodies[0];
    tbody.replaceChildren();
    for (const v of record.verdicts || []) {
      const row = document.createElement("tr");
      cell(row, v.check);
      cell(row, v.action, `action-${v.action}`);
      cell(row, v.mode);
      cell(row, Number(v.score).toFixed(3));
      cell(row, (v.evidence || []).join("; "));
      tbody.appendChild(row);
    }
    $("detail-prompt").textContent = record.prompt_text ?? "(not kept)";
    $("detail-answer").textContent = record.answer_text ?? "(not kept)";
    $("detail-details").textContent = JSON.stringify(record.details || {}, null, 2);
    $("detail").hidden = false;
  } catch (error) {
    setStatus(`Could not load record ${seq}: ${error.message}`, true);
  }
}

async function verifyChain() {
  const box = $("verify-result");
  box.hidden = false;
  box.className = "";
  box.textContent = "Verifying the hash chain…";
  try {
    const report = await api("/audit/verify");
    box.className = report.ok ? "ok" : "failed";
    box.replaceChildren();
    const summary = document.createElement("strong");
    summary.textContent = report.ok
      ? `Chain OK: ${report.records} records, ${report.first_seq}..${report.head_seq}, head ${report.head_hash.slice(0, 16)}…`
      : `Chain FAILED: ${report.problems.length} problem(s)`;
    box.appendChild(summary);
    if (report.problems.length) {
      const list = document.createElement("ul");
      for (const problem of report.problems) {
        const item = document.createElement("li");
        item.textContent = problem;
        list.appendChild(item);
      }
      box.appendChild(list);
    }
  } catch (error) {
    box.className = "failed";
    box.textContent = `Could not verify: ${error.message}`;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("api-key").value = apiKey();
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_STORAGE, $("api-key").value.trim());
    loadPage(true);
  });
  $("forget-key").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_STORAGE);
    $("api-key").value = "";
    setStatus("Key forgotten.");
  });
  $("filters").addEventListener("submit", (event) => {
    event.preventDefault();
    loadPage(true);
  });
  $("more").addEventListener("click", () => loadPage(false));
  $("verify").addEventListener("click", verifyChain);
  if (apiKey()) loadPage(true);
});
