// Ray's own dashboard, started with `--proxy-server-url` at Afterglow, in headless Chromium
// (playwright-core from tests/browser): the jobs page lists the finished job, and the job page
// shows its progress counts and task table from Afterglow's history. Screenshots go to
// SCREENSHOTS_DIR.
//
//   node ray_dashboard.mjs DASHBOARD_URL JOB_ID TOTAL FAILED SCREENSHOTS_DIR
import { mkdirSync } from "node:fs";
import { launchChromium } from "../browser/launch.mjs";

const [base, jobId, total, failed, shots] = process.argv.slice(2);
mkdirSync(shots, { recursive: true });
const browser = await launchChromium();
const seen = (text) => (page) => page.getByText(text, { exact: false }).first()
  .waitFor({ timeout: 60000 });
const page = await browser.newPage({ viewport: { width: 1440, height: 1000 } });
try {
  await page.goto(`${base}/#/jobs`, { waitUntil: "load" });
  await seen(jobId)(page);
  console.log(`ok: the jobs page lists job ${jobId}`);
  await page.screenshot({ path: `${shots}/ray-dashboard-jobs.png`, fullPage: true });

  await page.goto(`${base}/#/jobs/${jobId}`, { waitUntil: "load" });
  await seen(`Total: ${total}`)(page);
  await seen(`Failed: ${failed}`)(page);
  console.log(`ok: the job page's progress shows Total: ${total}, Failed: ${failed}`);
  // The task table section starts collapsed.
  await page.getByText("Task Table", { exact: true }).first().click();
  await seen(`TOTAL x ${total}`)(page);
  console.log(`ok: the job page's task table counts ${total} tasks`);
  await page.screenshot({ path: `${shots}/ray-dashboard-job.png`, fullPage: true });
} catch (err) {
  // What the page showed instead of what was expected.
  await page.screenshot({ path: `${shots}/ray-dashboard-failed.png`, fullPage: true });
  throw err;
} finally {
  await browser.close();
}
