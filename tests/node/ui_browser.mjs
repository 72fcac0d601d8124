// The dashboard in a real browser: Debian's chromium, headless, driven by puppeteer-core against
// a real agentboxd (tests/ui/ui_browser_test.cc starts it and this script).
//
//   node ui_browser.mjs BASE_URL TOKEN SCREENSHOT_DIR
//
// Prints "ok <step>" per step; exits 1 naming the first step that failed. Screenshots of every
// main page go to SCREENSHOT_DIR (in the build tree) for a reviewer to look at.
import fs from "node:fs";
import path from "node:path";
import { launchChromium } from "./ui_chromium.mjs";

const [base, token, shots] = process.argv.slice(2);
if (!base || !token || !shots) {
  console.error("usage: node ui_browser.mjs BASE_URL TOKEN SCREENSHOT_DIR");
  process.exit(2);
}
fs.mkdirSync(shots, { recursive: true });
const T = 20000; // ms: the longest any one step may wait

let step = "start";
const seen = []; // every URL the page asked for (HTTP and WebSocket)
const consoleErrors = [];

async function api(method, p, body, raw) {
  const res = await fetch(base + p, {
    method,
    headers: {
      Authorization: "Bearer " + token,
      ...(body ? { "Content-Type": "application/json" } : raw ? { "Content-Type": "application/yaml" } : {}),
    },
    body: body ? JSON.stringify(body) : raw,
  });
  const text = await res.text();
  return { status: res.status, text, json: () => JSON.parse(text) };
}

function check(cond, what) {
  if (!cond) throw new Error(what);
}

const browser = await launchChromium();
let failed = false;
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 800 });
  page.setDefaultTimeout(T);
  page.on("request", (r) => seen.push(r.url()));
  page.on("console", (m) => m.type() === "error" && consoleErrors.push(m.text()));
  const refused = []; // the API's refusals the page met (a wrong token, a bad template: expected)
  page.on("response", (r) => r.status() >= 400 && refused.push(r.status() + " " + r.request().method() + " " + r.url()));
  const cdp = await page.createCDPSession();
  await cdp.send("Network.enable");
  cdp.on("Network.webSocketCreated", (e) => seen.push(e.url));
  const shot = (name) => page.screenshot({ path: path.join(shots, name + ".png") });
  const ok = (s) => console.log("ok " + s);
  const text = (sel) => page.$eval(sel, (e) => e.textContent);
  // Click a row's button in a live list. The list redraws its rows (events, reloads), so a handle
  // taken a moment before the click may be gone: find and click it in one step in the page.
  const press = (sel) =>
    page.waitForFunction((s) => { const e = document.querySelector(s); e?.click(); return !!e; }, {}, sel);

  step = "the login page loads";
  await page.goto(base + "/ui/", { waitUntil: "domcontentloaded" });
  await page.waitForSelector("#token");
  await shot("login");
  ok(step);

  step = "a wrong token is refused";
  await page.type("#token", "not-the-token");
  await page.click("form.login button[type=submit]");
  await page.waitForFunction(() => /Wrong token/.test(document.querySelector(".status.error")?.textContent || ""));
  check((await page.evaluate(() => sessionStorage.length)) === 0, "a refused token was kept");
  ok(step);

  step = "the right token logs in";
  await page.$eval("#token", (e) => (e.value = ""));
  await page.type("#token", token);
  await page.click("form.login button[type=submit]");
  await page.waitForFunction(() => document.querySelector("h1")?.textContent.startsWith("Sessions"));
  await page.waitForFunction(() => document.querySelector(".live")?.textContent === "live");
  ok(step);

  step = "a session created elsewhere appears live";
  const other = await api("POST", "/v1/sessions", { id: "ui-other", labels: { team: "b" } });
  check(other.status === 201, "create ui-other: " + other.text);
  await page.waitForSelector('.vrow[data-id="ui-other"]');
  ok(step);

  step = "create a session from the form";
  await page.click("details.card summary");
  await page.type('form.create input[name="id"]', "ui-s1");
  await page.type('form.create input[name="labels"]', "team=a");
  await page.click("form.create button[type=submit]");
  await page.waitForFunction(() => document.getElementById("session-state")?.textContent === "running");
  const made = await api("GET", "/v1/sessions/ui-s1");
  check(made.status === 200 && made.json().labels.team === "a", "ui-s1 via the API: " + made.text);
  ok(step);

  step = "the session's usage shows what its box uses";
  await page.waitForFunction(() => /\d (KiB|MiB|GiB)/.test(document.querySelector("#usage-memory b")?.textContent || ""));
  await page.waitForFunction(() => /^[1-9]\d*/.test(document.querySelector("#usage-pids b")?.textContent || ""));
  // CPU is a rate: it shows from the second sample on.
  await page.waitForFunction(() => /%/.test(document.querySelector("#usage-cpu b")?.textContent || ""));
  const usage = (await api("GET", "/v1/sessions/ui-s1/usage")).json();
  check(usage.state === "running" && usage.memory_bytes > 0, "usage via the API: " + JSON.stringify(usage));
  ok(step);

  step = "the terminal runs echo hi";
  await page.waitForFunction(() => document.querySelector(".terminal [role=status]")?.textContent === "connected");
  await page.waitForSelector(".xterm-helper-textarea");
  await page.focus(".xterm-helper-textarea");
  await page.keyboard.type("echo hi\n");
  await page.waitForFunction(() =>
    [...document.querySelectorAll(".xterm-rows > div")].some((r) => r.textContent.trim() === "hi"),
  );
  await shot("terminal");
  ok(step);

  step = "the terminal follows the window's size";
  const sttySize = async (marker) => {
    await page.focus(".xterm-helper-textarea");
    await page.keyboard.type("echo " + marker + " $(stty size)\n");
    const h = await page.waitForFunction((m) => {
      const row = [...document.querySelectorAll(".xterm-rows > div")].map((r) => r.textContent.trim()).find((t) => new RegExp("^" + m + " \\d+ \\d+$").test(t));
      return row ? row.split(" ").slice(1).map(Number) : false;
    }, {}, marker);
    return h.jsonValue();
  };
  const [rows1, cols1] = await sttySize("size1");
  await page.setViewport({ width: 900, height: 700 });
  await page.waitForFunction(() => document.querySelector(".xterm-screen").getBoundingClientRect().width < 880);
  let rows2 = rows1, cols2 = cols1;
  for (let i = 0; i < 20 && cols2 === cols1; i++) {
    await new Promise((r) => setTimeout(r, 100));
    [rows2, cols2] = await sttySize("size" + (i + 2));
  }
  check(cols2 < cols1, `cols ${cols1} -> ${cols2} (rows ${rows1} -> ${rows2})`);
  await page.setViewport({ width: 1280, height: 800 });
  ok(step + ` (${cols1}x${rows1} -> ${cols2}x${rows2})`);

  step = "upload a file by drag and drop";
  await page.click("#tab-1");
  await page.waitForSelector("ul.files li");
  const xssName = "<img src=x onerror=window.__xss=1>.txt";
  await page.evaluate((xss) => {
    const dt = new DataTransfer();
    dt.items.add(new File(["dropped in the browser\n"], "dropped.txt", { type: "text/plain" }));
    dt.items.add(new File(["x"], xss, { type: "text/plain" }));
    const zone = document.querySelector(".drop");
    zone.dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
  }, xssName);
  await page.waitForSelector('ul.files li[data-name="dropped.txt"]');
  const viaApi = await api("GET", "/v1/sessions/ui-s1/files?path=/workspace/dropped.txt");
  check(viaApi.status === 200 && viaApi.text === "dropped in the browser\n", "dropped.txt via the API: " + viaApi.text);
  await page.waitForFunction((n) => [...document.querySelectorAll("ul.files li")].some((l) => l.dataset.name === n), {}, xssName);
  check((await page.evaluate(() => window.__xss)) === undefined, "a file name ran as markup");
  check((await page.$$("ul.files img")).length === 0, "a file name became an element");
  ok(step);

  step = "view and edit a text file";
  await page.evaluate(() =>
    [...document.querySelectorAll("ul.files li")].find((l) => l.dataset.name === "dropped.txt").querySelector("button.link").click(),
  );
  await page.waitForSelector(".editor textarea");
  await page.$eval(".editor textarea", (e) => (e.value = "edited in the browser\n"));
  await page.evaluate(() => [...document.querySelectorAll(".editor button")].find((b) => b.textContent === "Save").click());
  await page.waitForFunction(() => /Saved/.test(document.querySelector(".editor .status")?.textContent || ""));
  const edited = await api("GET", "/v1/sessions/ui-s1/files?path=/workspace/dropped.txt");
  check(edited.text === "edited in the browser\n", "the edit via the API: " + edited.text);
  await shot("files");
  ok(step);

  step = "new folder, rename and delete (each through its dialog)";
  const dialog = async (value) => {
    await page.waitForSelector("dialog.modal[open]");
    if (value !== undefined) {
      await page.$eval("dialog.modal input", (e) => (e.value = ""));
      await page.type("dialog.modal input", value);
    }
    await page.click("dialog.modal button[type=submit]");
    await page.waitForFunction(() => !document.querySelector("dialog.modal"));
  };
  const fileButton = (name, label) =>
    page.evaluate((n, l) => [...document.querySelectorAll("ul.files li")].find((li) => li.dataset.name === n)
      .querySelector('button[aria-label="' + l + " " + n + '"]').click(), name, label);
  await page.evaluate(() => [...document.querySelectorAll(".filebrowser button")].find((b) => b.textContent === "New folder").click());
  await dialog("sub");
  await page.waitForSelector('ul.files li[data-name="sub"]');
  await fileButton("dropped.txt", "Rename");
  await dialog("moved.txt");
  await page.waitForSelector('ul.files li[data-name="moved.txt"]');
  check((await api("GET", "/v1/sessions/ui-s1/files?path=/workspace/moved.txt")).text === "edited in the browser\n", "moved.txt via the API");
  await fileButton("sub", "Delete");
  await dialog();
  await page.waitForFunction(() => !document.querySelector('ul.files li[data-name="sub"]'));
  check((await api("GET", "/v1/sessions/ui-s1/stat?path=/workspace/sub")).status === 404, "sub still exists");
  ok(step);

  step = "follow a process log";
  await page.click("#tab-2");
  await page.type('form[aria-label="start a process"] input[name="command"]',
    "for i in 1 2 3; do echo line$i; sleep 0.2; done; echo follow-done");
  await page.type('form[aria-label="start a process"] input[name="tag"]', "loop");
  await page.click('form[aria-label="start a process"] button[type=submit]');
  await page.waitForFunction(() => /line1/.test(document.querySelector("pre.log")?.textContent || ""));
  await page.waitForFunction(() => /follow-done[\s\S]*\[exited, code 0\]/.test(document.querySelector("pre.log").textContent));
  await shot("processes");
  ok(step);

  step = "signal a running process from its row";
  await page.type('form[aria-label="start a process"] input[name="command"]', "echo waiting; exec sleep 600");
  await page.type('form[aria-label="start a process"] input[name="tag"]', "sleeper");
  await page.click('form[aria-label="start a process"] button[type=submit]');
  await page.waitForFunction(() => /waiting/.test(document.querySelector("pre.log")?.textContent || ""));
  await page.waitForSelector('tr[data-ref="sleeper"] select');
  await page.select('tr[data-ref="sleeper"] select', "SIGTERM");
  await page.evaluate(() => [...document.querySelectorAll('tr[data-ref="sleeper"] button')].find((b) => b.textContent === "Send").click());
  await page.waitForFunction(() => /\[exited, signal 15\]/.test(document.querySelector("pre.log").textContent));
  const sleeper = (await api("GET", "/v1/sessions/ui-s1/processes/sleeper")).json();
  check(sleeper.state === "killed" && sleeper.signal === 15, "sleeper via the API: " + JSON.stringify(sleeper));
  ok(step);

  step = "mounts, network and health tabs";
  await page.click("#tab-3");
  await page.waitForSelector('form[aria-label="network policy"]');
  await shot("settings");
  await page.click("#tab-4");
  await page.waitForFunction(() => /healthy/.test(document.querySelector(".panel .badge")?.textContent || ""));
  await shot("health");
  ok(step);

  step = "a denied connection appears in the network tab";
  const allow = await api("POST", "/v1/sessions/ui-s1/network", { mode: "allowlist", allow: ["allowed.test"] });
  check(allow.status === 200, "allowlist: " + allow.text);
  const denied = await api("POST", "/v1/sessions/ui-s1/exec", {
    argv: ["python3", "-c", "import urllib.request\ntry: urllib.request.urlopen('http://denied.test/', timeout=10)\nexcept Exception as e: print(e)"],
  });
  check(denied.status === 200 && /403/.test(denied.json().stdout), "the box's request was not refused: " + denied.text);
  await page.click("#tab-3");
  await page.waitForFunction(() => /denied\.test/.test(document.getElementById("denied")?.textContent || ""));
  await shot("denied");
  ok(step);

  step = "suspend and resume";
  await page.evaluate(() => [...document.querySelectorAll(".sesshead button")].find((b) => b.textContent === "Suspend").click());
  await page.waitForFunction(() => document.getElementById("session-state")?.textContent === "suspended");
  check((await api("GET", "/v1/sessions/ui-s1")).json().state === "suspended", "not suspended via the API");
  await page.evaluate(() => [...document.querySelectorAll(".sesshead button")].find((b) => b.textContent === "Resume").click());
  await page.waitForFunction(() => document.getElementById("session-state")?.textContent === "running");
  check((await api("GET", "/v1/sessions/ui-s1")).json().state === "running", "not resumed via the API");
  ok(step);

  step = "the sessions list filters by label and state";
  await page.goto(base + "/ui/#/sessions");
  await page.waitForSelector('.vrow[data-id="ui-s1"]');
  await page.type('input[aria-label="filter by label"]', "team=b");
  await page.waitForFunction(() => !document.querySelector('.vrow[data-id="ui-s1"]') && document.querySelector('.vrow[data-id="ui-other"]'));
  await page.$eval('input[aria-label="filter by label"]', (e) => ((e.value = ""), e.dispatchEvent(new Event("input"))));
  await page.waitForSelector('.vrow[data-id="ui-s1"]');
  const tenantOf = (await api("GET", "/v1/sessions/ui-s1")).json().tenant;
  await page.type('input[aria-label="filter by tenant"]', "no-such-tenant");
  await page.waitForFunction(() => !document.querySelector('.vrow[data-id="ui-s1"]'));
  await page.$eval('input[aria-label="filter by tenant"]', (e, t) => ((e.value = t), e.dispatchEvent(new Event("input"))), tenantOf);
  await page.waitForSelector('.vrow[data-id="ui-s1"]');
  await page.$eval('input[aria-label="filter by tenant"]', (e) => ((e.value = ""), e.dispatchEvent(new Event("input"))));
  await shot("sessions");
  await page.setViewport({ width: 390, height: 844 });
  await shot("sessions-phone");
  await page.setViewport({ width: 1280, height: 800 });
  ok(step);

  step = "destroy asks first";
  await press('.vrow[data-id="ui-other"] button[data-action="destroy"]');
  await page.waitForSelector("dialog.modal[open]");
  await page.click("dialog.modal button.danger");
  await page.waitForFunction(() => !document.querySelector('.vrow[data-id="ui-other"]'));
  check((await api("GET", "/v1/sessions/ui-other")).status === 404, "ui-other still exists");
  ok(step);

  step = "archive a session, then restore it from its archive";
  check((await api("POST", "/v1/sessions", { id: "ui-arch" })).status === 201, "ui-arch not created");
  check((await api("PUT", "/v1/sessions/ui-arch/files?path=kept.txt", undefined, "kept\n")).status < 300, "kept.txt not written");
  await page.goto(base + "/ui/#/sessions/ui-arch");
  await page.waitForFunction(() => document.getElementById("session-state")?.textContent === "running");
  await page.evaluate(() => [...document.querySelectorAll(".sesshead button")].find((b) => b.textContent === "Archive…").click());
  await page.waitForSelector("dialog.modal[open]");
  await page.click("dialog.modal button.danger");
  await page.waitForSelector("#archive-path");
  check((await api("GET", "/v1/sessions/ui-arch")).status === 404, "ui-arch still exists after its archive");
  await page.evaluate(() => [...document.querySelectorAll(".sesshead button")].find((b) => b.textContent === "Restore it").click());
  await page.waitForFunction(() => document.getElementById("session-state")?.textContent === "running");
  const kept = await api("GET", "/v1/sessions/ui-arch/files?path=kept.txt");
  check(kept.status === 200 && kept.text === "kept\n", "kept.txt after the restore: " + kept.status + " " + kept.text);
  ok(step);

  step = "templates: a bad YAML is refused in words, a good one builds with its log";
  await page.goto(base + "/ui/#/templates");
  await page.waitForSelector('textarea[aria-label="template YAML"]');
  await page.$eval('textarea[aria-label="template YAML"]', (e) => (e.value = "name: [broken\n"));
  await page.evaluate(() => [...document.querySelectorAll("button")].find((b) => b.textContent === "Push").click());
  await page.waitForFunction(() => [...document.querySelectorAll(".status.error")].some((s) => s.textContent.length > 5));
  const shownError = await page.evaluate(() => [...document.querySelectorAll(".status.error")].map((s) => s.textContent).join(""));
  const apiError = (await api("POST", "/v1/templates", undefined, "name: [broken\n")).json().error.message;
  check(shownError === apiError, "shown: " + shownError + " / the API says: " + apiError);
  // The line the error names is shown under the editor, with its number.
  await page.waitForFunction(() => /^\d+ \| /.test(document.getElementById("yaml-error")?.textContent || "") && !document.getElementById("yaml-error").hidden);
  await page.$eval('textarea[aria-label="template YAML"]', (e) =>
    (e.value = "name: uihello\nversion: 1\nfiles:\n  hello.txt: \"hi\\n\"\nsetup:\n  - echo setup-ran-in-the-box\n"));
  await page.evaluate(() => [...document.querySelectorAll("button")].find((b) => b.textContent === "Push").click());
  await page.waitForSelector('tr[data-name="uihello"]');
  await press('tr[data-name="uihello"] button.primary');
  await page.waitForFunction(() => /\[build (succeeded|failed)/.test(document.querySelector("pre.log")?.textContent || ""), { timeout: 60000 });
  const buildLog = await text("pre.log");
  check(/\[build succeeded/.test(buildLog), "the build did not succeed: " + buildLog);
  // The end of the build reloads the list (its row is drawn anew): click the row that shows the
  // built version, not the one the reload is about to replace.
  await page.waitForFunction(() => /^\d+$/.test(document.querySelector('tr[data-name="uihello"] td:nth-child(2)')?.textContent || ""));
  await press('tr[data-name="uihello"] button.link');
  await page.waitForSelector(".card h2");
  await shot("templates");
  ok(step);

  step = "images: a pull the registry cannot serve is shown in words, nothing is listed";
  await page.goto(base + "/ui/#/images");
  await page.waitForFunction(() => /No images yet/.test(document.getElementById("images")?.textContent || ""));
  await page.type('input[aria-label="image reference"]', "127.0.0.1:1/none/such:1");
  await page.click('form[aria-label="pull an image"] button[type=submit]');
  await page.waitForFunction(() => [...document.querySelectorAll(".status.error")].some((s) => /127\.0\.0\.1:1/.test(s.textContent)), { timeout: 60000 });
  check((await api("GET", "/v1/images")).json().images.length === 0, "an image was stored");
  await shot("images");
  ok(step);

  step = "operations";
  await page.goto(base + "/ui/#/ops");
  await page.waitForFunction(() => document.querySelectorAll("table.metrics tbody tr").length > 3);
  await page.waitForFunction(() => /session\.create/.test(document.querySelector("table.audit tbody")?.textContent || ""));
  await page.waitForFunction(() => /\(this one\)/.test(document.getElementById("nodes")?.textContent || "") && /up/.test(document.getElementById("nodes").textContent));
  await page.type('input[aria-label="audit session"]', "ui-other");
  await page.click('form[aria-label="audit filters"] button[type=submit]');
  await page.waitForFunction(() => {
    const rows = [...document.querySelectorAll("table.audit tbody tr")];
    return rows.length > 0 && rows.every((r) => r.children[3]?.textContent === "ui-other");
  });
  await shot("operations");
  ok(step);

  step = "the policy forbids inline script";
  const blocked = await page.evaluate(
    () =>
      new Promise((resolve) => {
        document.addEventListener("securitypolicyviolation", (e) => resolve(e.violatedDirective), { once: true });
        const s = document.createElement("script");
        s.textContent = "window.__inline = 1";
        document.body.appendChild(s);
        setTimeout(() => resolve(window.__inline === 1 ? "ran" : "no event"), 2000);
      }),
  );
  check(/script-src/.test(String(blocked)), "inline script: " + blocked);
  check((await page.evaluate(() => window.__inline)) === undefined, "an inline script ran");
  ok(step);

  step = "the token is in no URL, no cookie and not in localStorage";
  check(seen.length > 10, "few requests seen: " + seen.length);
  const leaks = seen.filter((u) => u.includes(token) || /[?&]token=/.test(u));
  check(leaks.length === 0, "the token is in: " + leaks.join(" "));
  const wsUrls = seen.filter((u) => u.startsWith("ws"));
  check(wsUrls.length >= 2 && wsUrls.every((u) => /[?&]ticket=[0-9a-f]{64}/.test(u)), "WebSockets: " + wsUrls.join(" "));
  check((await page.evaluate(() => localStorage.length)) === 0, "localStorage is used");
  check((await page.cookies()).length === 0, "cookies are set");
  ok(step + " (" + seen.length + " requests, " + wsUrls.length + " WebSockets)");
  // Only the two refusals this script provoked (the wrong token, the broken template).
  check(refused.length === 2 && /^401 GET .*\/v1\/sessions$/.test(refused[0]) && /^400 POST .*\/v1\/templates$/.test(refused[1]),
    "the page met refusals: " + refused.join(" | "));
  if (consoleErrors.length) console.log("console errors (not failures): " + consoleErrors.join(" | "));
} catch (e) {
  failed = true;
  console.error("FAILED at step: " + step + ": " + (e && e.message));
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
