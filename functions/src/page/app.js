// The Afterglow dashboard: every panel is one call to the query API (relative URLs, so a
// dashboard proxy can serve the page and the API under any prefix). Nothing loads the whole
// table: the task list pages with keyset cursors, panels read pre-grouped answers.

const BOUNDS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5,
  5e5, 1e6, 2e6, 5e6, 1e7, 2e7, 5e7];
const LIVE_WINDOW_MS = 120_000;
const REFRESH_MS = 5_000;
// With every session in scope finished, the cluster list is asked this seldom, only to notice
// a new session; a picked session that finished is never asked again (a session never restarts).
const DISCOVER_MS = 60_000;
// Where node and worker ids link (AFTERGLOW_GRAFANA_URL, written into the page by the server).
const GRAFANA = document.querySelector('meta[name="afterglow-grafana-url"]')?.content ?? "";
const ZONE = Intl.DateTimeFormat().resolvedOptions().timeZone;

const $ = (id) => document.getElementById(id);
// The table's filters: what the panels, cards and findings set (job_id also from the picker).
const filters = {
  state: "", name: "", func_or_class_name: "", error_type: "", job_id: "", node_id: "",
  worker_id: "", q: "", error_fingerprint: "", min_attempt: "", min_duration_ms: "", min_wait_ms: "",
  latest_attempt: "",
};
let sort = "creation";
let cursors = [null];
let clusters = [];

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children.flat()) {
    if (child != null) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// Clickable by mouse and keyboard alike: focusable, announced as a button (unless `attrs`
// says otherwise), Enter or Space acts.
function action(run, attrs = {}) {
  return {
    tabindex: "0", role: "button", ...attrs, onclick: run,
    onkeydown: (event) => {
      if (event.target !== event.currentTarget) return;
      if (event.key === "Enter" || event.key === " ") { event.preventDefault(); run(); }
    },
  };
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  for (const child of children.flat()) if (child != null) node.append(child);
  return node;
}

function scopeParams() {
  const params = new URLSearchParams();
  if ($("cluster").value) params.set("cluster", $("cluster").value);
  if ($("session").value) params.set("session", $("session").value);
  const job = $("job").value || filters.job_id;
  if (job) params.set("job_id", job);
  const since = $("since").value, until = $("until").value;
  // The pickers hold the viewer's local time, as the page shows every time.
  if (since) params.set("since_ms", String(new Date(since).getTime()));
  if (until) params.set("until_ms", String(new Date(until).getTime()));
  return params;
}

function filterParams(extra = {}) {
  const params = scopeParams();
  for (const [name, value] of Object.entries(filters)) {
    if (value && name !== "job_id") params.set(name, value);
  }
  for (const [name, value] of Object.entries(extra)) params.set(name, value);
  return params;
}

async function api(path, params = new URLSearchParams()) {
  const query = params.toString();
  const response = await fetch(`api/${path}${query ? "?" + query : ""}`);
  const text = await response.text();
  let body = null;
  try { body = JSON.parse(text); } catch { /* a proxy's or gateway's error page */ }
  if (!response.ok) throw new Error(body?.error || `${path}: ${response.status} ${text.slice(0, 200)}`);
  if (body === null) throw new Error(`${path}: the answer is not JSON`);
  return body;
}

// Each panel draws only the answer to its newest request: a slow answer to an older filter
// must not overwrite the newer one.
const latest = {};
function ticket(name) {
  const mine = (latest[name] = (latest[name] ?? 0) + 1);
  return () => latest[name] === mine;
}

function showError(err) {
  $("error").textContent = err.message;
  $("error").hidden = false;
  setTimeout(() => { $("error").hidden = true; }, 6000);
}

const short = (id) => (id ? id.slice(0, 8) : "");
const pad = (n, width = 2) => String(n).padStart(width, "0");
function when(ms) {
  if (ms == null) return "";
  const t = new Date(ms);
  return `${t.getFullYear()}-${pad(t.getMonth() + 1)}-${pad(t.getDate())} ` +
    `${pad(t.getHours())}:${pad(t.getMinutes())}:${pad(t.getSeconds())}.${pad(t.getMilliseconds(), 3)}`;
}

// An id linked to the Grafana dashboard, for the attempt's session and time, or just the id.
function grafanaLink(variable, id, task, text = id) {
  if (!GRAFANA || !id) return text;
  const url = new URL(GRAFANA, location.href);
  url.searchParams.set(`var-${variable}`, id);
  if (task.session_name) url.searchParams.set("var-SessionName", task.session_name);
  const from = task.start_time_ms ?? task.creation_time_ms;
  if (from != null) {
    url.searchParams.set("from", String(from - 60_000));
    url.searchParams.set("to", String((task.end_time_ms ?? Date.now()) + 60_000));
  }
  return el("a", {
    href: url.toString(), target: "_blank", rel: "noopener", class: "grafana", "data-var": variable,
    title: `${id} in Grafana`, onclick: (event) => event.stopPropagation(),
    onkeydown: (event) => event.stopPropagation(),
  }, text);
}
function duration(ms) {
  if (ms == null) return "";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  return `${(ms / 60_000).toFixed(1)} min`;
}

function setFilter(changes) {
  Object.assign(filters, changes);
  cursors = [null];
  refresh();
}

// --- scope pickers -------------------------------------------------------------------------

// Every cluster and session, newest first, page after page; a cluster whose sessions go on
// past a page comes again on the next one, with the rest of them. A session whose first event
// time moved earlier between two pages may come twice: it is kept where it came first.
async function allClusters() {
  const merged = [];
  const byName = new Map();
  let cursor = null;
  do {
    const params = new URLSearchParams({ limit: "1000" });
    if (cursor) params.set("cursor", cursor);
    const page = await api("clusters", params);
    for (const c of page.clusters) {
      const known = byName.get(c.cluster);
      if (!known) {
        const entry = { cluster: { ...c, sessions: [...c.sessions] },
          names: new Set(c.sessions.map((s) => s.session_name)) };
        byName.set(c.cluster, entry);
        merged.push(entry.cluster);
        continue;
      }
      for (const s of c.sessions) {
        if (known.names.has(s.session_name)) continue;
        known.names.add(s.session_name);
        known.cluster.sessions.push(s);
      }
    }
    cursor = page.next;
  } while (cursor);
  return merged;
}

async function loadScope() {
  clusters = await allClusters();
  const cluster = $("cluster"), session = $("session");
  const chosenCluster = cluster.value, chosenSession = session.value;
  cluster.replaceChildren(el("option", { value: "" }, "all"),
    ...clusters.map((c) => el("option", { value: c.cluster }, `${c.cluster} (${c.attempts})`)));
  cluster.value = chosenCluster;
  const sessions = clusters.filter((c) => !chosenCluster || c.cluster === chosenCluster)
    .flatMap((c) => c.sessions);
  session.replaceChildren(el("option", { value: "" }, "all"),
    ...sessions.map((s) => el("option", { value: s.session_name }, s.session_name)));
  session.value = chosenSession;
  const jobs = await api("jobs", (() => {
    const params = new URLSearchParams();
    if (chosenCluster) params.set("cluster", chosenCluster);
    if (chosenSession) params.set("session", chosenSession);
    params.set("limit", "1000");
    return params;
  })());
  const job = $("job"), chosenJob = job.value;
  job.replaceChildren(el("option", { value: "" }, "all"),
    ...jobs.jobs.map((j) => el("option", { value: j.job_id }, `${j.job_id} ${j.entrypoint || ""}`.trim())));
  job.value = chosenJob;
}

// The sessions the pickers select.
function sessionsInScope() {
  const cluster = $("cluster").value, session = $("session").value;
  return clusters.filter((c) => !cluster || c.cluster === cluster).flatMap((c) => c.sessions)
    .filter((s) => !session || s.session_name === session);
}

function scopeIsLive() {
  const now = Date.now();
  return sessionsInScope().some((s) => s.last_ms && now - s.last_ms < LIVE_WINDOW_MS);
}

// --- summary cards -------------------------------------------------------------------------

async function loadSummary() {
  const params = filterParams();
  params.delete("state");
  const current = ticket("summary");
  const summary = await api("summary", params);
  if (!current()) return;
  const cards = [["TOTAL", summary.total, ""]].concat(
    Object.entries(summary.by_state).sort((a, b) => b[1] - a[1]).map(([state, n]) => [state, n, state]));
  $("cards").replaceChildren(...cards.map(([label, n, state]) =>
    el("div", action(() => setFilter({ state: filters.state === state ? "" : state }), {
      class: `card state-${state}${filters.state === state && state ? " active" : ""}`,
      "data-state": state, "aria-pressed": String(filters.state === state && state !== ""),
    }), el("span", { class: "n" }, n.toLocaleString()), el("span", { class: "label" }, label))));
  $("span").textContent = summary.total
    ? `attempts created ${when(summary.first_ms)} … last event ${when(summary.last_ms)} (${ZONE})`
    : "no attempts match";
}

// --- aggregate panels ----------------------------------------------------------------------

function histogram(distribution) {
  const width = 120, height = 24, slot = width / (BOUNDS.length + 1);
  const max = Math.max(1, ...distribution.histogram.map((b) => b.count));
  const p99 = distribution.p99;
  return svg("svg", { class: "hist", width, height, viewBox: `0 0 ${width} ${height}` },
    svg("title", {}, `p50 ${duration(distribution.p50)} · p90 ${duration(distribution.p90)} · p99 ${duration(p99)} · max ${duration(distribution.max)}`),
    distribution.histogram.map((bucket) => {
      const index = bucket.le == null ? BOUNDS.length : BOUNDS.indexOf(bucket.le);
      const h = Math.max(1, Math.sqrt(bucket.count / max) * height);
      const tail = p99 != null && (bucket.le == null || bucket.le > p99);
      return svg("rect", { x: index * slot, y: height - h, width: slot - 1, height: h, class: tail ? "tail" : "" });
    }));
}

async function loadPanel(panel) {
  const by = panel.dataset.by;
  const params = filterParams({ by, limit: "12" });
  params.delete("state");
  params.delete(by);
  const current = ticket(`panel-${by}`);
  const answer = await api("aggregates", params);
  if (!current()) return;
  const rows = answer.groups.map((group) => el("div", { class: "group" },
    el("span", action(() => setFilter({ [by]: group.key ?? "" }), { class: "key", title: group.key ?? "(none)" }),
      group.key ?? "(none)"),
    el("span", { class: "counts" }, Object.entries(group.by_state).map(([state, n]) =>
      el("span", action(() => setFilter({ [by]: group.key ?? "", state }), {
        class: `count state-${state}`, "data-state": state, "data-key": group.key ?? "",
        title: `${n} ${state}`, "aria-label": `${n} ${state} of ${group.key ?? "(none)"}`,
      }), n.toLocaleString()))),
    histogram(group.duration_ms)));
  panel.querySelector(".rows").replaceChildren(...(rows.length ? rows : [el("p", { class: "span" }, "nothing here")]));
}

// --- insights ------------------------------------------------------------------------------

// A click (or Enter) on a finding shows exactly its attempts: its filter replaces the table's.
// Every filter change asks again; an unchanged answer is not redrawn, so the finding a keyboard
// user has focused stays in the page (redrawn, it dropped the focus before Enter arrived).
let drawnFindings = null;
async function loadInsights() {
  const current = ticket("insights");
  const answer = await api("insights", scopeParams());
  if (!current()) return;
  const drawn = JSON.stringify(answer.findings);
  if (drawn === drawnFindings) return;
  drawnFindings = drawn;
  const items = answer.findings.map((finding) => {
    const show = () => setFilter(Object.fromEntries(Object.keys(filters).map((name) =>
      [name, finding.filter[name] ?? ""])));
    return el("li", action(show, {
      class: `finding severity-${finding.severity}`,
      "data-kind": finding.kind, "data-count": String(finding.count), title: finding.title,
    }), el("span", { class: "kind" }, finding.kind.replace(/_/g, " ")), finding.title);
  });
  $("findings").replaceChildren(...(items.length ? items : [el("li", { class: "span" }, "nothing stands out")]));
}

// --- task table ----------------------------------------------------------------------------

function renderFilters() {
  const chips = Object.keys(filters).filter((name) => filters[name])
    .map((name) => el("span", action(() => {
      if (name === "q") $("search").value = "";
      setFilter({ [name]: "" });
    }, { class: "chip", title: `remove ${name}` }), `${name}=${filters[name]}`));
  $("filters").replaceChildren(...chips);
  $("timeline").href = `api/timeline?${filterParams().toString()}`;
}

async function loadTasks() {
  const params = filterParams({ sort, limit: "50", include_error_message: "true" });
  const cursor = cursors[cursors.length - 1];
  if (cursor) params.set("cursor", cursor);
  const current = ticket("tasks");
  const page = await api("tasks", params);
  if (!current()) return;
  $("rows").replaceChildren(...page.tasks.map((task) => el("tr", action(() => openTask(task).catch(showError), {
    "data-task": task.task_id, role: "row", "aria-label": `open ${task.name ?? task.task_id}`,
  }),
  el("td", { class: `state-${task.state}` }, task.state),
  el("td", {}, task.name ?? ""),
  el("td", { class: "id", title: task.task_id }, short(task.task_id)),
  el("td", {}, task.attempt_number),
  el("td", { class: "id" }, task.job_id ?? ""),
  el("td", { class: "id", title: task.node_id ?? "" }, grafanaLink("NodeId", task.node_id, task, short(task.node_id))),
  el("td", { class: "error", title: task.error_message ?? "" }, task.error_type ?? ""),
  el("td", {}, duration(task.duration_ms)),
  el("td", {}, when(task.creation_time_ms)))));
  $("next").disabled = !page.next;
  $("next").onclick = () => { cursors.push(page.next); loadTasks().catch(showError); };
  $("first").disabled = cursors.length === 1;
}

// --- task detail ---------------------------------------------------------------------------

function transitions(events) {
  if (!events.length) return null;
  // Evenly spaced in order (transitions often bunch within a millisecond), each labelled with
  // its offset from the first.
  const width = 640, start = events[0].created_ms;
  const step = events.length > 1 ? (width - 120) / (events.length - 1) : 0;
  const stagger = events.length > 5 ? 24 : 0;
  const height = 52 + stagger;
  return svg("svg", { class: "transitions", width: "100%", height, viewBox: `0 0 ${width} ${height}` },
    svg("line", { x1: 60, y1: 16, x2: width - 60, y2: 16 }),
    events.map((event, index) => {
      const x = 60 + index * step;
      return svg("g", {},
        svg("circle", { cx: x, cy: 16, r: 5, class: event.state }, svg("title", {}, `${event.state} ${when(event.created_ms)}`)),
        svg("text", { x, y: 34 + (index % 2) * stagger, "text-anchor": "middle" }, event.state.replace(/_/g, " ").toLowerCase()),
        svg("text", { x, y: 46 + (index % 2) * stagger, "text-anchor": "middle", class: "offset" },
          index === 0 ? when(event.created_ms).slice(11) : `+${duration(event.created_ms - start)}`));
    }));
}

// The attempt's own stdout and stderr (shipped by `afterglow ship-logs`), loaded after the
// detail is shown; a 404 says why there is none.
function attemptOutput(task, attempt) {
  if (!attempt.task_log_info?.stdout_file && !attempt.task_log_info?.stderr_file) return null;
  const box = el("div", { class: "output" });
  for (const stream of ["stdout", "stderr"]) {
    const pre = el("pre", { class: "log", "data-stream": stream }, "loading…");
    box.append(el("h4", {}, stream), pre);
    const params = new URLSearchParams({
      cluster: task.cluster, session: task.session_name,
      attempt: String(attempt.attempt_number), stream,
    });
    fetch(`api/tasks/${task.task_id}/logs?${params}`).then(async (response) => {
      const text = await response.text();
      if (response.ok) {
        pre.textContent = text || "(nothing printed)";
        if (response.headers.get("x-afterglow-log-complete") === "false") {
          pre.append("\n… (the rest was never shipped)");
        }
        if (response.headers.get("x-afterglow-log-range") === "inferred") {
          pre.append("\n(Ray never reported where this attempt's output is, since its worker died: " +
            "this is what the worker wrote between its previous task and its next)");
        }
      } else {
        let message = text;
        try { message = JSON.parse(text).error ?? text; } catch { /* not JSON */ }
        pre.textContent = message;
        pre.classList.add("muted");
      }
    }).catch((error) => { pre.textContent = String(error); pre.classList.add("muted"); });
  }
  return box;
}

async function openTask(task) {
  const params = new URLSearchParams({ cluster: task.cluster, session: task.session_name });
  const current = ticket("detail");
  const detail = await api(`tasks/${task.task_id}`, params);
  if (!current()) return;
  const body = detail.attempts.map((attempt) => el("div", { class: "attempt" },
    el("h3", {}, `attempt ${attempt.attempt_number}: `, el("span", { class: `state-${attempt.state}` }, attempt.state),
      attempt.synthesized_failure ? " (failed by Ray at job end or worker death)" : ""),
    transitions(attempt.events),
    attempt.error_message ? el("pre", { class: "trace" }, `${attempt.error_type ?? ""}\n${attempt.error_message}`) : null,
    attemptOutput(task, attempt),
    el("dl", {}, [
      ["task", attempt.task_id], ["name", attempt.name], ["function", attempt.func_or_class_name],
      ["type", attempt.type], ["job", attempt.job_id], ["actor", attempt.actor_id],
      ["parent", attempt.parent_task_id],
      ["node", attempt.node_id && grafanaLink("NodeId", attempt.node_id, { ...task, ...attempt })],
      ["worker", attempt.worker_id && grafanaLink("WorkerId", attempt.worker_id, { ...task, ...attempt })],
      ["pid", attempt.worker_pid], ["created", when(attempt.creation_time_ms)],
      ["started", when(attempt.start_time_ms)], ["ended", when(attempt.end_time_ms)],
      ["duration", duration(attempt.duration_ms)],
      ["resources", attempt.required_resources ? JSON.stringify(attempt.required_resources) : null],
      ["stdout", attempt.task_log_info?.stdout_file], ["stderr", attempt.task_log_info?.stderr_file],
    ].filter(([, value]) => value != null && value !== "").flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, value)]))));
  $("detail-body").replaceChildren(el("h2", {}, task.name ?? task.task_id), ...body);
  $("detail").hidden = false;
}

// --- wiring --------------------------------------------------------------------------------

// The page is aria-busy while any refresh is still waiting for answers.
let refreshing = 0;
async function refresh() {
  renderFilters();
  refreshing += 1;
  document.body.setAttribute("aria-busy", "true");
  const work = [loadSummary(), loadInsights(), ...[...document.querySelectorAll(".panel")].map(loadPanel),
    loadTasks()];
  const results = await Promise.allSettled(work);
  refreshing -= 1;
  if (refreshing === 0) document.body.removeAttribute("aria-busy");
  const failed = results.find((result) => result.status === "rejected");
  if (failed) showError(failed.reason);
}

function init() {
  for (const id of ["cluster", "session", "job", "since", "until"]) {
    $(id).addEventListener("change", async () => {
      if (id === "cluster" || id === "session") await loadScope().catch(showError);
      cursors = [null];
      refresh();
    });
  }
  $("sort").addEventListener("change", () => { sort = $("sort").value; cursors = [null]; loadTasks().catch(showError); });
  $("search").addEventListener("keydown", (event) => {
    if (event.key === "Enter") setFilter({ q: $("search").value.trim() });
  });
  $("first").addEventListener("click", () => { cursors = [null]; loadTasks().catch(showError); });
  $("close").addEventListener("click", () => { $("detail").hidden = true; });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") $("detail").hidden = true;
  });
  loadScope().then(refresh).catch(showError);
  // Live scopes refresh every REFRESH_MS; finished ones are not polled (see DISCOVER_MS).
  let asked = Date.now();
  setInterval(async () => {
    if (!$("live").checked || document.hidden) return;
    const live = scopeIsLive();
    if (!live && ($("session").value || Date.now() - asked < DISCOVER_MS)) return;
    asked = Date.now();
    await loadScope().catch(() => {});
    if (scopeIsLive()) refresh();
  }, REFRESH_MS);
}

init();
