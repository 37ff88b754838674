// The dashboard page in a real browser (Debian's Chromium, driven by playwright-core) over a
// fixture run served by `afterglow serve` (with AFTERGLOW_GRAFANA_URL set to GRAFANA_URL), in a
// time zone that is not UTC: every panel shows real data; a FAILED count, chosen from the
// keyboard, filters the table to the failed attempts; opening one shows its stack trace and
// links its node and worker to Grafana; the time filters read local time; a finished session
// is not polled. Screenshots go to SCREENSHOTS (CI keeps them as artifacts).
//
//   node dashboard.mjs BASE_URL EXPECTED_FAILED SCREENSHOTS_DIR GRAFANA_URL
import { mkdirSync } from "node:fs";
import { launchChromium } from "./launch.mjs";

const [base, expectedFailedText, shots, grafana] = process.argv.slice(2);
// India: +05:30 all year, so a time read as UTC lands 5.5 hours off.
const ZONE = "Asia/Kolkata", ZONE_OFFSET_MS = 330 * 60_000;
const expectedFailed = Number(expectedFailedText);
mkdirSync(shots, { recursive: true });

function check(condition, message) {
  if (!condition) throw new Error(message);
  console.log(`ok: ${message}`);
}

const browser = await launchChromium();
const failures = [];
try {
  const page = await browser.newPage({ viewport: { width: 1440, height: 1000 }, timezoneId: ZONE });
  const asked = [];
  page.on("request", (request) => {
    if (new URL(request.url()).pathname.startsWith("/api/")) asked.push(request.url());
  });
  // No request for `ms` (the run finished long ago, so nothing is live).
  async function quietFor(ms, what) {
    // Let the answers to the last change arrive first (a load state, once reached, stays so).
    for (let seen = -1; seen !== asked.length;) {
      seen = asked.length;
      await page.waitForTimeout(1500);
    }
    const before = asked.length;
    await page.waitForTimeout(ms);
    check(asked.length === before, `${what}: no request in ${ms / 1000} s (${asked.slice(before).join(", ")})`);
  }
  page.on("pageerror", (err) => failures.push(`page error: ${err.message}`));
  page.on("console", (message) => {
    // A task's output answers 404 when no log was shipped (this run ships none): the page shows
    // why, and Chromium logs the status as a failed load; any other error fails the test.
    const expected404 = /\/api\/tasks\/[0-9a-f]+\/logs\?/.test(message.location().url ?? "") &&
      message.text().includes("404");
    if (message.type() === "error" && !expected404) failures.push(`console error: ${message.text()} (${message.location().url})`);
  });
  await page.goto(base + "/", { waitUntil: "networkidle" });

  // Every panel shows fixture data.
  await page.waitForSelector(".card[data-state='FAILED']");
  await page.waitForSelector(".panel[data-by='name'] .group");
  await page.waitForSelector(".panel[data-by='error_type'] .group");
  await page.waitForSelector(".panel[data-by='job_id'] .group");
  await page.waitForSelector("#rows tr");
  const failedCard = await page.textContent(".card[data-state='FAILED'] .n");
  check(Number(failedCard.replace(/\D/g, "")) === expectedFailed,
    `the FAILED card shows ${failedCard}, Ray lists ${expectedFailed}`);
  check((await page.locator(".panel[data-by='name'] svg.hist rect").count()) > 0,
    "duration histograms are drawn");
  const clusters = await page.locator("#cluster option").count();
  check(clusters > 1, "the cluster picker lists the cluster");
  check((await page.textContent("#span")).includes(`(${ZONE})`) ||
    (await page.textContent("#span")).includes("(Asia/Calcutta)"), "times are shown in the viewer's zone");
  await page.screenshot({ path: `${shots}/1-overview.png`, fullPage: true });
  // Auto-refresh is on, but every session has finished: nothing is asked again.
  await quietFor(11_000, "auto-refresh over finished sessions");

  // A FAILED count in the function panel, reached from the keyboard, filters the table to that
  // function's failures.
  const count = page.locator(".panel[data-by='name'] .count.state-FAILED").first();
  const name = await count.getAttribute("data-key");
  const n = Number((await count.textContent()).replace(/\D/g, ""));
  await count.focus();
  await page.keyboard.press("Enter");
  await page.waitForFunction(
    ([wanted, rows]) => document.querySelectorAll("#rows tr").length === rows &&
      [...document.querySelectorAll("#rows tr td:first-child")].every((td) => td.textContent === "FAILED") &&
      [...document.querySelectorAll("#rows tr td:nth-child(2)")].every((td) => td.textContent === wanted),
    [name, Math.min(n, 50)], { timeout: 10_000 });
  check(true, `Enter on FAILED of ${name} shows its ${n} failed attempts only`);
  const chips = await page.textContent("#filters");
  check(chips.includes("state=FAILED") && chips.includes(`name=${name}`), `filter chips: ${chips}`);
  await page.screenshot({ path: `${shots}/2-failed-filter.png`, fullPage: true });

  // Opening one (from the keyboard) shows its stack trace.
  await page.locator("#rows tr").first().focus();
  await page.keyboard.press("Enter");
  await page.waitForSelector("#detail:not([hidden]) pre.trace");
  const trace = await page.textContent("#detail pre.trace");
  check(/Traceback|File "|Error/.test(trace), "the detail panel shows the stack trace");
  check((await page.locator("#detail svg.transitions circle").count()) >= 2,
    "the detail panel draws the state transitions");
  // Its output: this run shipped no logs, and the panel says what would keep them.
  await page.waitForFunction(() => [...document.querySelectorAll("#detail pre.log")]
    .some((pre) => pre.textContent.includes("ship-logs")), null, { timeout: 10_000 });
  check(true, "the detail panel shows the attempt's output section (no logs shipped: says how)");
  // Its node and worker link to Grafana's dashboard for that id, session and time.
  const taskId = await page.locator("#rows tr").first().getAttribute("data-task");
  const detail = await (await page.request.get(`${base}/api/tasks/${taskId}`)).json();
  const attempt = detail.attempts[0];
  for (const [variable, id] of [["NodeId", attempt.node_id], ["WorkerId", attempt.worker_id]]) {
    const href = await page.getAttribute(`#detail .attempt a.grafana[data-var='${variable}']`, "href");
    const link = new URL(href);
    check(href.startsWith(grafana.split("?")[0]) && link.searchParams.get("orgId") === "1" &&
      link.searchParams.get(`var-${variable}`) === id &&
      link.searchParams.get("var-SessionName") === attempt.session_name &&
      Number(link.searchParams.get("from")) < attempt.start_time_ms &&
      Number(link.searchParams.get("to")) > attempt.end_time_ms,
    `the ${variable} links to Grafana: ${href}`);
  }
  check((await page.getAttribute("#rows tr:first-child a.grafana[data-var='NodeId']", "href"))
    .includes(`var-NodeId=${attempt.node_id}`), "the table's node id links to Grafana");
  await page.screenshot({ path: `${shots}/3-task-detail.png`, fullPage: true });
  await page.keyboard.press("Escape");
  await page.waitForSelector("#detail", { state: "hidden" });
  check(true, "Escape closes the detail panel");

  // A finding (the largest failure cluster) filters the table to exactly its attempts.
  while ((await page.locator(".chip").count()) > 0) {
    await page.locator(".chip").first().click();
  }
  const finding = page.locator("#findings li[data-kind='failure_cluster']").first();
  const expected = Number(await finding.getAttribute("data-count"));
  check(expected > 1, `the first finding is a failure cluster of ${expected} attempts`);
  // A focused finding keeps the focus while the page refreshes around it (the findings were
  // redrawn on every refresh, and an Enter pressed just after a filter change went nowhere).
  await finding.focus();
  await page.evaluate(() => document.getElementById("since").dispatchEvent(new Event("change")));
  await page.waitForFunction(() => !document.body.hasAttribute("aria-busy"), null, { timeout: 10_000 });
  check(await page.evaluate(() => document.activeElement?.dataset.kind === "failure_cluster"),
    "a focused finding keeps the focus while the page refreshes");
  await page.keyboard.press("Enter");
  await page.waitForFunction((rows) => document.querySelectorAll("#rows tr").length === rows &&
    [...document.querySelectorAll("#rows tr td:first-child")].every((td) => td.textContent === "FAILED") &&
    document.querySelector("#filters").textContent.includes("error_fingerprint="),
  Math.min(expected, 50), { timeout: 10_000 });
  // Answers to the filters cleared just before must not overwrite it once they arrive.
  await page.waitForFunction(() => !document.body.hasAttribute("aria-busy"), null, { timeout: 10_000 });
  check((await page.locator("#rows tr").count()) === Math.min(expected, 50) &&
    (await page.locator("#rows tr td:first-child").allTextContents()).every((text) => text === "FAILED"),
  `Enter on the failure cluster shows its ${expected} failed attempts only, after every answer arrived`);
  await page.screenshot({ path: `${shots}/4-insight.png`, fullPage: true });

  // Search by a word of a stack trace, and the Perfetto link.
  while ((await page.locator(".chip").count()) > 0) {
    await page.locator(".chip").first().click();
  }
  await page.fill("#search", "keyerror");
  await page.press("#search", "Enter");
  await page.waitForFunction(() => document.querySelector("#filters").textContent === "q=keyerror");
  await page.waitForFunction(() => [...document.querySelectorAll("#rows tr td:nth-child(2)")]
    .some((td) => td.textContent === "Counter.boom"), null, { timeout: 10_000 });
  check(true, "searching `keyerror` finds the actor method whose stack trace raised KeyError");
  const href = await page.getAttribute("#timeline", "href");
  check(href.startsWith("api/timeline?"), `timeline link ${href}`);
  const trace_json = await (await page.request.get(`${base}/${href}`)).json();
  check(Array.isArray(trace_json.traceEvents), "the timeline link answers Chrome trace JSON");
  await page.screenshot({ path: `${shots}/5-search.png`, fullPage: true });
  while ((await page.locator(".chip").count()) > 0) {
    await page.locator(".chip").first().focus();
    await page.keyboard.press("Enter");
  }

  // The time filters read the viewer's local time: "to" one minute before the first attempt,
  // in Kolkata time, matches nothing (read as UTC it would match everything).
  const summary = await (await page.request.get(`${base}/api/summary`)).json();
  const local = (ms) => new Date(ms + ZONE_OFFSET_MS).toISOString().slice(0, 16);
  await page.fill("#until", local(summary.first_ms - 60_000));
  await page.waitForFunction(() => document.querySelector("#span").textContent === "no attempts match");
  await page.fill("#until", local(summary.last_ms + 60_000));
  await page.waitForFunction((total) => document.querySelector(".card .n")?.textContent.replace(/\D/g, "") === String(total),
    summary.total);
  check(true, "the To filter is read in the viewer's time zone");

  // A picked session that finished is never asked about again.
  const session = await page.locator("#session option").nth(1).getAttribute("value");
  await page.selectOption("#session", session);
  await page.waitForSelector(".card[data-state='FAILED']");
  await quietFor(11_000, `the finished session ${session}`);
} finally {
  await browser.close();
}
if (failures.length) {
  console.error(failures.join("\n"));
  process.exit(1);
}
console.log("dashboard: all checks passed");
