// One session: its state and actions, then tabs: terminal, files, processes, mounts and
// network, health (with repair).
import { api, enc, get, post } from "./api";
import { clear, fmtAge, h, status } from "./dom";
import { filesView } from "./files";
import { confirmDialog } from "./modal";
import type { Cleanup } from "./main";
import { processesView } from "./processes";
import { type Session, sessionAction } from "./sessions";
import { terminalView } from "./terminal";
import { usageView } from "./usage";

function show(v: unknown): string {
  if (v === undefined || v === null || v === "") return "—";
  if (typeof v !== "object") return String(v);
  const parts = Object.entries(v as Record<string, unknown>).map(([k, x]) => k + "=" + (typeof x === "object" ? JSON.stringify(x) : String(x)));
  return parts.join(", ") || "—";
}

function kv(rows: [string, unknown][]): HTMLElement {
  return h("dl", { class: "kv" }, ...rows.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, show(v)))));
}

// The proxy's refusals for this session (the audit log's net.deny lines), newest first,
// refreshed every 5 s while the tab is open.
function deniedView(id: string): { el: HTMLElement; stop: () => void } {
  const rows = h("tbody", { id: "denied" });
  const load = async () => {
    try {
      const r = await get("/v1/audit?limit=50&event=net.deny&session=" + enc(id));
      clear(rows);
      // eslint-disable-next-line @typescript-eslint/no-explicit-any
      for (const l of [...r.lines].reverse() as any[]) {
        rows.appendChild(h("tr", {}, h("td", { title: l.time }, fmtAge(l.time) + " ago"), h("td", { class: "mono" }, l.method), h("td", { class: "mono" }, l.host + (l.port ? ":" + l.port : "")), h("td", {}, l.reason)));
      }
      if (!r.lines.length) rows.appendChild(h("tr", {}, h("td", { colspan: "4", class: "muted" }, "No connection of this session was denied.")));
    } catch (err) {
      clear(rows);
      rows.appendChild(h("tr", {}, h("td", { colspan: "4", class: "status error" }, err instanceof Error ? err.message : String(err))));
    }
  };
  load();
  const t = setInterval(load, 5000);
  const el = h("div", {}, h("h3", {}, "Denied connections"), h("table", {}, h("thead", {}, h("tr", {}, ...["When", "Method", "Host", "Why"].map((x) => h("th", {}, x)))), rows));
  return { el, stop: () => clearInterval(t) };
}

function settingsView(id: string, s: Session, reload: () => void): { el: HTMLElement; stop: () => void } {
  const base = "/v1/sessions/" + enc(id);
  const st = status();
  const mounts = h(
    "table",
    {},
    h("thead", {}, h("tr", {}, h("th", {}, "Host path"), h("th", {}, "In the box"), h("th", {}, "Mode"))),
    h(
      "tbody",
      {},
      // eslint-disable-next-line @typescript-eslint/no-explicit-any
      ...(s.mounts || []).map((m: any) => h("tr", {}, h("td", { class: "mono" }, m.host_path), h("td", { class: "mono" }, m.mount_path), h("td", {}, m.mode))),
      ...Object.entries(s.skills || {}).map(([name, dir]) =>
        h("tr", {}, h("td", { class: "mono" }, String(dir)), h("td", { class: "mono" }, "/workspace/.skills/" + name), h("td", {}, (s.skill_modes || {})[name] || "")),
      ),
    ),
  );
  const mountForm = h(
    "form",
    { class: "row", "aria-label": "add a mount" },
    h("input", { name: "host_path", placeholder: "/host/dir", required: true, "aria-label": "host path" }),
    h("input", { name: "mount_path", placeholder: "/workspace/data", required: true, "aria-label": "mount path" }),
    h("select", { name: "mode", "aria-label": "mode" }, h("option", {}, "ro"), h("option", {}, "rw")),
    h("button", { type: "submit" }, "Add mount"),
  );
  mountForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    const d = new FormData(mountForm);
    try {
      const r = await post(base + "/mounts", { mounts: [{ host_path: d.get("host_path"), mount_path: d.get("mount_path"), mode: d.get("mode") }] });
      st.ok("Mount added (" + r.applied + ")");
      reload();
    } catch (err) {
      st.error(err);
    }
  });
  const mode = h("select", { name: "mode", "aria-label": "network mode" }, ...["none", "allowlist", "open"].map((m) => h("option", { selected: s.network?.mode === m }, m)));
  const allow = h("input", { name: "allow", class: "wide", value: (s.network?.allow || []).join(", "), "aria-label": "allowed hosts" });
  const netForm = h("form", { class: "row", "aria-label": "network policy" }, mode, allow, h("button", { type: "submit" }, "Apply"));
  netForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body: Session = { mode: mode.value };
    if (mode.value === "allowlist") body.allow = allow.value.split(",").map((x) => x.trim()).filter(Boolean);
    try {
      await post(base + "/network", body);
      st.ok("Network policy applied");
      reload();
    } catch (err) {
      st.error(err);
    }
  });
  const denied = deniedView(id);
  const el = h("section", {}, st.el, h("h3", {}, "Mounts and skills"), mounts, mountForm, h("h3", {}, "Network policy"), netForm, h("p", { class: "muted" }, "allowlist: host names, *.domain or host:port, comma separated."), denied.el);
  return { el, stop: denied.stop };
}

function healthView(id: string): HTMLElement {
  const base = "/v1/sessions/" + enc(id);
  const st = status();
  const out = h("div");
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const show = (r: any) => {
    clear(out);
    out.append(
      h("p", {}, h("span", { class: "badge " + (r.healthy ? "running" : "failed") }, r.healthy ? "healthy" : "unhealthy")),
      h(
        "table",
        {},
        h("thead", {}, h("tr", {}, h("th", {}, "Check"), h("th", {}, "OK"), h("th", {}, "Detail"))),
        // eslint-disable-next-line @typescript-eslint/no-explicit-any
        h("tbody", {}, ...r.checks.map((c: any) => h("tr", {}, h("td", {}, c.name), h("td", {}, c.ok ? "yes" : "no"), h("td", { class: "mono" }, c.detail)))),
      ),
    );
  };
  const run = async (what: "health" | "repair") => {
    st.ok(what === "health" ? "Checking…" : "Repairing…");
    try {
      show(await post(base + "/" + what));
      st.clear();
    } catch (err) {
      st.error(err);
    }
  };
  const el = h("section", {}, h("div", { class: "row" }, h("button", { onclick: () => run("health") }, "Check"), h("button", { class: "primary", onclick: () => run("repair") }, "Repair")), st.el, out);
  run("health");
  return el;
}

export function sessionPage(main: HTMLElement, id: string, onCleanup: (c: Cleanup) => void): void {
  const st = status();
  const head = h("div", { class: "sesshead" });
  const panel = h("div", { class: "panel" });
  let stopPanel: (() => void) | null = null;
  let current: Session = {};
  const usage = usageView(id, () => current.limits || {});
  onCleanup(() => {
    stopPanel?.();
    usage.stop();
  });

  // DELETE ?archive=true: the workspace goes to an archive, then the session is destroyed; the
  // page then offers to restore it from that archive.
  async function archive(): Promise<void> {
    if (!(await confirmDialog("Archive session " + id + " and destroy it? Its workspace is kept as an archive under the daemon's data dir; its processes stop.", "Archive and destroy"))) return;
    // Nothing of the page may ask about the session while it goes.
    usage.stop();
    stopPanel?.();
    stopPanel = null;
    try {
      const r = await api("DELETE", "/v1/sessions/" + enc(id) + "?archive=true");
      clear(head);
      clear(panel);
      const restore = h("button", { class: "primary" }, "Restore it");
      restore.addEventListener("click", async () => {
        try {
          await post("/v1/sessions/" + enc(id) + "/restore", { archive: r.archive });
          location.reload();
        } catch (err) {
          st.error(err);
        }
      });
      head.append(h("h1", {}, id, " ", h("span", { class: "badge stopped", id: "session-state" }, "archived")), h("p", {}, "Archived to ", h("code", { id: "archive-path" }, r.archive)), restore);
    } catch (err) {
      st.error(err);
    }
  }

  async function reload(): Promise<void> {
    try {
      current = await get("/v1/sessions/" + enc(id));
      clear(head);
      const act = (label: string, a: "suspend" | "resume" | "destroy") =>
        h(
          "button",
          {
            class: a === "destroy" ? "danger" : "",
            onclick: async () => {
              try {
                if (!(await sessionAction(id, a))) return;
                if (a === "destroy") location.hash = "#/sessions";
                else reload();
              } catch (err) {
                st.error(err);
              }
            },
          },
          label,
        );
      head.append(
        h("h1", {}, id, " ", h("span", { class: "badge " + current.state, id: "session-state" }, current.state)),
        h("div", { class: "row" }, current.state === "running" ? act("Suspend", "suspend") : act("Resume", "resume"), h("button", { onclick: archive }, "Archive…"), act("Destroy", "destroy")),
        kv([
          ["backend", current.backend],
          ["created", fmtAge(current.created_at) + " ago"],
          ["last used", fmtAge(current.last_used_at) + " ago"],
          ["ttl", current.ttl_sec ? current.ttl_sec + " s" : ""],
          ["limits", current.limits],
          ["network", current.network?.mode],
          ["labels", current.labels],
          ["template", current.template],
          ["uid", current.uid],
        ]),
      );
    } catch (err) {
      st.error(err);
    }
  }

  const tabs: [string, () => { el: HTMLElement; stop?: () => void }][] = [
    ["Terminal", () => terminalView(id)],
    ["Files", () => ({ el: filesView(id) })],
    ["Processes", () => processesView(id)],
    ["Mounts & network", () => settingsView(id, current, () => reload().then(() => show(3)))],
    ["Health", () => ({ el: healthView(id) })],
  ];
  const buttons = tabs.map(([name], i) => h("button", { role: "tab", id: "tab-" + i, onclick: () => show(i) }, name));
  function show(i: number): void {
    stopPanel?.();
    stopPanel = null;
    clear(panel);
    buttons.forEach((b, j) => b.setAttribute("aria-selected", String(i === j)));
    const v = tabs[i][1]();
    stopPanel = v.stop || null;
    panel.appendChild(v.el);
  }
  main.append(h("p", {}, h("a", { href: "#/sessions" }, "← Sessions")), head, usage.el, st.el, h("div", { class: "tabs", role: "tablist" }, ...buttons), panel);
  reload().then(() => show(0));
}
