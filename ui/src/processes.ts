// The processes of a session: the list, start one, follow a log live (NDJSON with
// follow=true, resumed with since=<offset> after a drop), signal or kill.
import { api, enc, get, ndjson, post } from "./api";
import { clear, fmtAge, h, status } from "./dom";

const MAX_LOG = 512 * 1024; // characters kept on screen

export function processesView(id: string): { el: HTMLElement; stop: () => void } {
  const base = "/v1/sessions/" + enc(id) + "/processes";
  const st = status();
  const table = h("tbody");
  const logTitle = h("h3", {}, "Log");
  const log = h("pre", { class: "log", tabindex: "0", "aria-label": "process log", "aria-live": "off" });
  const follow = h("input", { type: "checkbox", checked: true, "aria-label": "scroll with the log" });
  let stream: AbortController | null = null;
  let stopped = false;

  async function load(): Promise<void> {
    try {
      const r = await get(base);
      clear(table);
      for (const p of r.processes) table.appendChild(row(p));
      if (!r.processes.length) table.appendChild(h("tr", {}, h("td", { colspan: "6", class: "muted" }, "No processes.")));
    } catch (err) {
      st.error(err);
    }
  }

  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  function row(p: any): HTMLElement {
    const ref = p.tag || String(p.pid);
    const sig = h("select", { "aria-label": "signal for " + ref }, ...["SIGINT", "SIGTERM", "SIGHUP", "SIGKILL", "SIGUSR1", "SIGUSR2"].map((s) => h("option", {}, s)));
    const cmd = p.command ?? (p.argv || []).join(" ");
    return h(
      "tr",
      { "data-ref": ref },
      h("td", {}, h("button", { class: "link", onclick: () => followLog(ref) }, ref)),
      h("td", { class: "mono" }, cmd),
      h("td", {}, h("span", { class: "badge " + p.state }, p.state), p.state === "killed" ? " signal " + p.signal : p.state === "exited" ? " code " + p.exit_code : ""),
      h("td", {}, fmtAge(p.started_at)),
      h("td", {}, p.managed ? "managed, " + p.restarts + " restarts" : ""),
      h(
        "td",
        {},
        p.state === "running"
          ? [
              sig,
              h("button", { class: "small", onclick: () => act(() => post(base + "/" + enc(ref) + "/signal", { signal: sig.value })) }, "Send"),
              h("button", { class: "small danger", onclick: () => act(() => api("DELETE", base + "/" + enc(ref))) }, "Kill"),
            ]
          : null,
      ),
    );
  }

  async function act(f: () => Promise<unknown>): Promise<void> {
    try {
      await f();
      st.ok("Done");
      setTimeout(load, 300);
    } catch (err) {
      st.error(err);
    }
  }

  function append(text: string): void {
    let t = (log.textContent || "") + text;
    if (t.length > MAX_LOG) t = t.slice(t.length - MAX_LOG);
    log.textContent = t;
    if (follow.checked) log.scrollTop = log.scrollHeight;
  }

  async function followLog(ref: string): Promise<void> {
    stream?.abort();
    const ctl = new AbortController();
    stream = ctl;
    logTitle.textContent = "Log of " + ref;
    log.textContent = "";
    let since = 0;
    let ended = false;
    while (!ended && !ctl.signal.aborted && !stopped) {
      try {
        await ndjson(
          base + "/" + enc(ref) + "/output?follow=true&since=" + since,
          (j) => {
            if (j.type === "exit") {
              ended = true;
              append("\n[exited" + (j.signal ? ", signal " + j.signal : ", code " + j.exit_code) + "]\n");
              load();
            } else {
              append(j.data);
              since = j.offset + new TextEncoder().encode(j.data).length;
            }
          },
          ctl.signal,
        );
        ended = true;
      } catch (err) {
        if (ctl.signal.aborted) return;
        st.error(err);
        await new Promise((r) => setTimeout(r, 2000));
      }
    }
  }

  const form = h(
    "form",
    { class: "row", "aria-label": "start a process" },
    h("input", { name: "command", placeholder: "command, e.g. python3 -m http.server", class: "wide", required: true, "aria-label": "command" }),
    h("input", { name: "tag", placeholder: "tag", "aria-label": "tag" }),
    h("select", { name: "restart", "aria-label": "restart policy" }, ...["never", "on-failure", "always"].map((r) => h("option", {}, r))),
    h("button", { type: "submit", class: "primary" }, "Start"),
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const d = new FormData(form);
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    const body: any = { command: String(d.get("command")), restart: String(d.get("restart")) };
    if (String(d.get("tag") || "").trim()) body.tag = String(d.get("tag")).trim();
    try {
      const p = await post(base, body);
      form.reset();
      st.ok("Started " + (p.tag || p.pid));
      await load();
      followLog(p.tag || String(p.pid));
    } catch (err) {
      st.error(err);
    }
  });
  const el = h(
    "section",
    { class: "processes" },
    form,
    st.el,
    h("div", { class: "row" }, h("button", { onclick: () => load() }, "Refresh")),
    h("table", {}, h("thead", {}, h("tr", {}, ...["Ref", "Command", "State", "Started", "", ""].map((t) => h("th", {}, t)))), table),
    h("div", { class: "row" }, logTitle, h("label", { class: "muted" }, follow, " follow")),
    log,
  );
  load();
  return {
    el,
    stop() {
      stopped = true;
      stream?.abort();
    },
  };
}
