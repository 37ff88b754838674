// Ray's own dashboard, started with `--proxy-server-url` at Afterglow, in headless Chromium
// (playwright-core from tests/browser): every page of it, over Afterglow's history of the run.
// Each page of PAGES is opened in a tab of its own, so that what went wrong is told page by
// page: the texts it must show are waited for, then its own steps run (opening sections and
// tabs, a download); its uncaught errors, console errors and failed requests are recorded, and
// a screenshot is saved as SCREENSHOTS_DIR/ray-dashboard-<page>.png. One line per page is
// printed at the end; the exit status is 1 if a page missed an expectation or threw.
//
//   node ray_dashboard.mjs DASHBOARD_URL SCREENSHOTS_DIR FACTS_JSON
//
// FACTS_JSON, from Ray's own answers before the check (run.py, check_ray_dashboard):
//   job, total, failed, actors       the driver job with most tasks: its tasks, failed tasks
//                                    and actors
//   submission {id, job_id, entrypoint, message, driver_line}   the submission that failed
//   task {id, job_id, name, error_type, error, stdout}          a failed task that printed
//   printer {id, name, stdout, stderr}                         a task of the same job that
//                                    printed a line to each stream
//   actor {id, class_name, stdout}   one of the job's actors, and a line of its stdout log
//   node {id, ip}                    the head node
//   event                            a cluster event's message (the failed submission's start)
//   versions {ray, python}           the cluster's, from Ray's cluster metadata
//   log_file {name, line}            a worker's stdout file on that node and a line in it
//   killed {route, switch, id, message, log_file}   a node Ray reported DEAD, in another
//                                    cluster's history (Afterglow's Ray route `route`, which a
//                                    GET of `switch?to=ROUTE` makes the proxy read), and a
//                                    file shipped from it
//   route                            Afterglow's Ray route of the run's own cluster
import { mkdirSync, readFileSync } from "node:fs";
import { launchChromium } from "../browser/launch.mjs";

const [base, shots, factsJson] = process.argv.slice(2);
const facts = JSON.parse(factsJson);
const { job, submission, task, actor, node, killed } = facts;
const WAIT_MS = 30000;

mkdirSync(shots, { recursive: true });

// A string is looked for case-insensitively as part of a text, as users read; a RegExp as is
// (case matters for states such as FAILED, which "failed" in a message must not stand for).
// Only what is visible counts: Ray keeps its hidden log tabs rendered.
async function seen(scope, text) {
  await scope.getByText(text, { exact: false }).filter({ visible: true }).first()
    .waitFor({ timeout: WAIT_MS })
    .catch(() => { throw new Error(`${describe(text)} not shown in ${WAIT_MS / 1000} s`); });
}

const describe = (text) => (text instanceof RegExp ? String(text) : JSON.stringify(text));
const wholeLine = (text) => new RegExp(`^${text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}$`);

// A collapsible section of Ray's pages: its title is an <h4>, two levels below the section.
async function openSection(page, title) {
  await page.locator("h4", { hasText: title }).first().click()
    .catch(() => { throw new Error(`no section ${JSON.stringify(title)}`); });
  return page.locator(`xpath=//h4[normalize-space(.)=${JSON.stringify(title)}]/../..`).first();
}

async function openTab(page, title) {
  await page.getByRole("tab", { name: title, exact: true }).first().click()
    .catch(() => { throw new Error(`no tab ${JSON.stringify(title)}`); });
}

// Ray's log viewer draws only the lines in view: its keyword filter brings a line into it.
async function seenInLog(page, line) {
  await page.getByLabel("Keyword").filter({ visible: true }).first().fill(line);
  await seen(page, line);
}

// Ray links the trace as an <a href> to `api/v0/tasks/timeline?download=1&job_id=…`; whether
// the browser saves it or shows it rests on the answer's Content-Disposition.
async function downloadsTimeline(page) {
  const link = page.getByText("Download trace file", { exact: true }).first();
  const download = page.waitForEvent("download", { timeout: WAIT_MS }).catch(() => null);
  await link.click();
  const saved = await download;
  if (!saved) {
    const shown = page.url();
    await page.goBack();
    throw new Error(`"Download trace file" downloaded nothing (the browser showed ${shown}): `
      + "the timeline answer needs Content-Disposition: attachment");
  }
  const name = saved.suggestedFilename();
  if (!/^timeline-.*\.json$/.test(name)) throw new Error(`the trace downloads as ${name}`);
  const events = JSON.parse(readFileSync(await saved.path(), "utf8"));
  if (!Array.isArray(events) || events.length === 0) {
    throw new Error(`the trace file ${name} holds no events`);
  }
  return `the trace downloads as ${name} (${events.length} events)`;
}

// The Logs page lists only live nodes, and the Cluster page hides a dead node's "Log" link;
// its node page links its files whatever its state.
async function opensNodeLogs(page, fileName) {
  await page.getByRole("link", { name: "log", exact: true }).first().click()
    .catch(() => { throw new Error('no "log" link on the node page'); });
  await seen(page, fileName);
  return `its "log" link lists ${fileName}`;
}

const killedFileUrl = `#/logs/viewer?nodeId=${killed.id}`
  + `&fileName=${encodeURIComponent(killed.log_file.name)}`;

// The job's progress bar expands into its progress by lineage (Ray's `summary_by=lineage`),
// a row per top-level task or actor name; the job's tables are still closed then, so the name
// shows there alone.
async function expandsProgressByLineage(page, name) {
  const bar = page.locator("xpath=//label[contains(., 'Hide finished')]/../following-sibling::div[1]")
    .first();
  const lineage = page.waitForResponse((response) => response.url().includes("summary_by=lineage"),
    { timeout: WAIT_MS });
  await bar.click().catch(() => { throw new Error("no progress bar to expand"); });
  const answer = await lineage.catch(() => { throw new Error("no progress by lineage asked"); });
  if (answer.status() !== 200) throw new Error(`progress by lineage answered ${answer.status()}`);
  await seen(page, wholeLine(name));
  return `its progress by lineage lists ${name}`;
}

const PAGES = [
  {
    name: "overview", url: "#/overview",
    expect: ["Cluster status and autoscaler", "Recent jobs", submission.id, facts.event],
  },
  {
    name: "jobs", url: "#/jobs",
    expect: [job, submission.id],
    steps: async (page) => {
      const row = page.locator("tr", { hasText: submission.id });
      await seen(row, /^FAILED$/);
      return `${submission.id} is listed FAILED`;
    },
  },
  {
    name: "job", url: `#/jobs/${job}`,
    expect: [`Total: ${facts.total}`, `Failed: ${facts.failed}`],
    steps: async (page) => {
      const done = [];
      done.push(await expandsProgressByLineage(page, task.name));
      await seen(await openSection(page, "Task Table"), `TOTAL x ${facts.total}`);
      done.push(`task table: ${facts.total} tasks`);
      await seen(await openSection(page, "Actor Table"), `TOTAL x ${facts.actors}`);
      done.push(`actor table: ${facts.actors} actors`);
      // The workload makes no placement group: the section shows an empty table.
      await seen(await openSection(page, "Placement Group Table"), "TOTAL x 0");
      done.push("placement group table");
      done.push(await downloadsTimeline(page));
      return done.join("; ");
    },
  },
  {
    name: "job-failed", url: `#/jobs/${submission.id}`,
    expect: [/^FAILED$/, submission.entrypoint, submission.job_id],
    steps: async (page) => {
      // The submission's driver log, read from the node's files.
      await seen(page, wholeLine(submission.driver_line));
      // Ray shows the status message in a dialog.
      await page.getByText("View details", { exact: true }).first().click();
      await seen(page.getByRole("dialog"), submission.message);
      return "FAILED, its entrypoint, driver log and status message";
    },
  },
  {
    name: "task", url: `#/jobs/${task.job_id}/tasks/${task.id}`,
    expect: [task.name, /^FAILED$/, "Function or class name"],
    steps: async (page) => {
      await openTab(page, "Error stack trace");
      await seen(page, `Error Type: ${task.error_type}`);
      await seen(page, task.error);
      await openTab(page, "stdout");
      await seenInLog(page, task.stdout);
      return "its error stack trace and its stdout";
    },
  },
  {
    name: "task-printer", url: `#/jobs/${task.job_id}/tasks/${facts.printer.id}`,
    expect: [facts.printer.name, /^FINISHED$/],
    steps: async (page) => {
      await openTab(page, "stdout");
      await seenInLog(page, facts.printer.stdout);
      await openTab(page, "stderr");
      await seenInLog(page, facts.printer.stderr);
      return "its stdout and its stderr";
    },
  },
  {
    name: "actors", url: "#/actors",
    expect: [actor.id, actor.class_name],
  },
  {
    name: "actor", url: `#/actors/${actor.id}`,
    // The id alone is also the title while it loads.
    expect: ["Exit Detail", actor.class_name, /^DEAD$/],
    steps: async (page) => {
      await openTab(page, "stdout");
      await seenInLog(page, actor.stdout);
      return "its stdout log";
    },
  },
  {
    name: "cluster", url: "#/cluster",
    expect: [node.id, /^ALIVE$/, `${node.ip} (Head)`],
  },
  {
    name: "cluster-info", url: "#/cluster/info",
    expect: ["Python Version", wholeLine(facts.versions.python), wholeLine(facts.versions.ray)],
  },
  {
    name: "node", url: `#/cluster/nodes/${node.id}`,
    // NODE - id is also the title while it loads.
    expect: [/^ALIVE$/, "Hostname", node.ip],
  },
  {
    name: "logs", url: "#/logs",
    expect: [`Node ID: ${node.id}`],
  },
  {
    name: "logs-node", url: `#/logs/?nodeId=${node.id}`,
    expect: ["raylet.out", facts.log_file.name],
  },
  {
    name: "log-file",
    url: `#/logs/viewer?nodeId=${node.id}&fileName=${encodeURIComponent(facts.log_file.name)}`,
    expect: [`File: ${facts.log_file.name}`],
    steps: async (page) => {
      await seenInLog(page, facts.log_file.line);
      return `${facts.log_file.name} holds ${JSON.stringify(facts.log_file.line)}`;
    },
  },
  {
    name: "cluster-killed", route: killed.route, url: "#/cluster",
    expect: [killed.id, /^DEAD$/],
  },
  {
    name: "node-killed", route: killed.route, url: `#/cluster/nodes/${killed.id}`,
    expect: [/^DEAD$/, "Hostname"],
  },
  {
    name: "logs-node-killed", route: killed.route, url: `#/cluster/nodes/${killed.id}`,
    expect: [/^DEAD$/],
    steps: (page) => opensNodeLogs(page, killed.log_file.name),
  },
  {
    name: "log-file-killed", route: killed.route, url: killedFileUrl,
    expect: [`File: ${killed.log_file.name}`],
    steps: async (page) => {
      await seenInLog(page, killed.log_file.line);
      return `${killed.log_file.name} of the killed node holds its line`;
    },
  },
  {
    name: "serve", url: "#/serve",
    expect: ["Serve not started"],
  },
  {
    name: "metrics", url: "#/metrics",
    expect: ["Set up Prometheus and Grafana"],
    steps: async (page) => {
      const frames = await page.locator("iframe").count();
      if (frames) throw new Error(`${frames} Grafana iframes without a Grafana`);
      return "no iframe";
    },
  },
];

const firstLine = (err) => String(err?.message ?? err).split("\n")[0];

// Which cluster's history the dashboard reads: the proxy's, set before each page.
async function readFrom(route) {
  const response = await fetch(`${killed.switch}?to=${encodeURIComponent(route)}`);
  if (!response.ok) throw new Error(`the proxy did not switch to ${route}: ${response.status}`);
}

async function check(browser, { name, url, expect, steps, route }) {
  await readFrom(route ?? facts.route);
  const page = await browser.newPage({ viewport: { width: 1440, height: 1000 } });
  page.setDefaultTimeout(WAIT_MS);
  const result = { name, url, problems: [], pageErrors: [], consoleErrors: [], failed: [] };
  page.on("pageerror", (err) => result.pageErrors.push(firstLine(err)));
  page.on("console", (msg) => {
    if (msg.type() === "error") result.consoleErrors.push(msg.text().slice(0, 300));
  });
  // The requests behind console errors such as "Failed to load resource: 500".
  page.on("response", (response) => {
    if (response.status() >= 400) {
      result.failed.push(`${response.status()} ${response.url().replace(base, "")}`);
    }
  });
  try {
    await page.goto(`${base}/${url}`, { waitUntil: "load" });
    for (const text of expect) await seen(page, text);
    result.ok = steps ? await steps(page) : `shows ${expect.map(describe).join(", ")}`;
  } catch (err) {
    result.problems.push(firstLine(err));
  }
  // Ray's header is fixed: a full-page shot of a page scrolled by its steps shows it midway.
  await page.evaluate(() => window.scrollTo(0, 0)).catch(() => {});
  await page.screenshot({ path: `${shots}/ray-dashboard-${name}.png`, fullPage: true })
    .catch((err) => result.problems.push(`no screenshot: ${firstLine(err)}`));
  await page.close();
  return result;
}

const browser = await launchChromium();
const results = [];
try {
  for (const entry of PAGES) results.push(await check(browser, entry));
} finally {
  await browser.close();
}

// What every page logs (the app shell's requests) is told once, after the pages.
const everywhere = (key) => results.map((r) => new Set(r[key]))
  .reduce((a, b) => new Set([...a].filter((x) => b.has(x))));
const common = { consoleErrors: everywhere("consoleErrors"), failed: everywhere("failed") };
const told = (r, key) => [...new Set(r[key])].filter((x) => !common[key].has(x));

let failures = 0;
for (const r of results) {
  const bad = r.problems.length > 0 || r.pageErrors.length > 0;
  failures += bad;
  const what = bad
    ? `FAILED: ${[...r.problems, ...r.pageErrors.map((e) => `uncaught: ${e}`)].join("; ")}`
    : `ok: ${r.ok}`;
  console.log(`${r.name} (${r.url}) ${what}`);
  // Console errors fail nothing: Ray's own dashboard logs some too, e.g. for
  // api/prometheus_health's 500 without a Prometheus.
  for (const e of told(r, "consoleErrors")) console.log(`    console error: ${e}`);
  for (const f of told(r, "failed")) console.log(`    request failed: ${f}`);
}
for (const e of common.consoleErrors) console.log(`every page: console error: ${e}`);
for (const f of common.failed) console.log(`every page: request failed: ${f}`);
console.log(`Ray's dashboard pages: ${results.length - failures} of ${results.length} ok`);
process.exit(failures ? 1 : 0);
