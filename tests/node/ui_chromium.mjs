// The dashboard tests' browser: Debian's chromium (or $CHROMIUM), headless, driven by
// puppeteer-core. Shared by ui_browser.mjs and ui_many_sessions.mjs.
import puppeteer from "puppeteer-core";

export function launchChromium() {
  return puppeteer.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    // root in CI: chromium's own sandbox needs an unprivileged user.
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
  });
}
