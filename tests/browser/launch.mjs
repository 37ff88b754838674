// Headless Chromium for the browser checks (Debian's, or CHROMIUM), launched as both checks
// need it. Chromium now and then dies as it starts (a SIGSEGV before its first page) on the CI
// machines; that says nothing of the pages checked, so a start is tried three times, and
// every failed start is printed.
import { chromium } from "playwright-core";

const STARTS = 3;

/** A running browser. */
export async function launchChromium() {
  for (let start = 1; ; start++) {
    try {
      return await chromium.launch({
        executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
        args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
          "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"],
      });
    } catch (error) {
      if (start >= STARTS) throw error;
      console.log(`Chromium did not start (try ${start} of ${STARTS}): ${String(error.message).split("\n")[0]}`);
    }
  }
}
