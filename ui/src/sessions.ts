// Sessions: the caller's sessions, live from the /v1/events WebSocket (no polling), in a
// virtualised table (only the rows in view are in the DOM, so 1,000s of sessions stay fast),
// with filters by state, label and id, a create form, and suspend / resume / destroy.
import { api, enc, get, post, socket } from "./api";
import { clear, fmtAge, h, status } from "./dom";
import type { Cleanup } from "./main";
import { confirmDialog } from "./modal";

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Session = any;

const ROW = 44; // px, one table row (style.css .vrow)

function limitsText(l: Record<string, number> = {}): string {
  const parts: string[] = [];
  if (l.memory_mb) parts.push(l.memory_mb + " MiB");
  if (l.cpu_percent) parts.push(l.cpu_percent + "% cpu");
  if (l.max_pids) parts.push(l.max_pids + " pids");
  if (l.disk_mb) parts.push(l.disk_mb + " MiB disk");
  return parts.join(" · ") || "—";
}

function ttlText(s: Session): string {
  if (!s.ttl_sec) return "—";
  if (s.state !== "running") return s.ttl_sec + "s";
  const left = Math.round(s.ttl_sec - (Date.now() - Date.parse(s.last_used_at)) / 1000);
  return left > 0 ? left + "s left" : "due";
}

function labelsText(labels: Record<string, string> = {}): string {
  return Object.entries(labels)
    .map(([k, v]) => k + "=" + v)
    .join(", ");
}

export async function sessionAction(id: string, action: "suspend" | "resume" | "destroy"): Promise<boolean> {
  if (action === "destroy") {
    const ok = await confirmDialog(
      "Destroy session " + id + "? Its workspace and everything in it is deleted.",
      "Destroy",
    );
    if (!ok) return false;
    await api("DELETE", "/v1/sessions/" + enc(id));
    return true;
  }
  await post("/v1/sessions/" + enc(id) + "/" + action);
  return true;
}

function createForm(onCreated: (s: Session) => void): HTMLElement {
  const st = status();
  const f = (name: string, label: string, attrs: Record<string, string> = {}) =>
    h("label", {}, label, h("input", { name, ...attrs }));
  const net = h(
    "select",
    { name: "network" },
    h("option", { value: "" }, "default"),
    h("option", { value: "none" }, "none"),
    h("option", { value: "allowlist" }, "allowlist"),
    h("option", { value: "open" }, "open"),
  );
  const form = h(
    "form",
    { class: "create", "aria-label": "create a session" },
    f("id", "Id", { placeholder: "my-session", required: "", pattern: "[A-Za-z0-9._\\-]{1,128}" }),
    f("template", "Template", { placeholder: "name[@version]" }),
    f("memory_mb", "Memory MiB", { type: "number", min: "1" }),
    f("cpu_percent", "CPU %", { type: "number", min: "1" }),
    f("ttl_sec", "TTL s", { type: "number", min: "0" }),
    f("labels", "Labels", { placeholder: "team=a,env=dev" }),
    h("label", {}, "Network", net),
    f("allow", "Allow", { placeholder: "example.org,*.example.net" }),
    h("button", { type: "submit", class: "primary" }, "Create"),
    st.el,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    st.clear();
    const d = new FormData(form);
    const v = (k: string) => String(d.get(k) || "").trim();
    const body: Session = { id: v("id") };
    if (v("template")) body.template = v("template");
    const limits: Record<string, number> = {};
    if (v("memory_mb")) limits.memory_mb = Number(v("memory_mb"));
    if (v("cpu_percent")) limits.cpu_percent = Number(v("cpu_percent"));
    if (Object.keys(limits).length) body.limits = limits;
    if (v("ttl_sec")) body.ttl_sec = Number(v("ttl_sec"));
    if (v("labels")) {
      body.labels = {};
      for (const kv of v("labels").split(",")) {
        const [k, ...rest] = kv.split("=");
        if (k.trim()) body.labels[k.trim()] = rest.join("=").trim();
      }
    }
    if (v("network")) {
      body.network = { mode: v("network") };
      if (v("allow")) body.network.allow = v("allow").split(",").map((x) => x.trim()).filter(Boolean);
    }
    try {
      const s = await post("/v1/sessions", body);
      st.ok("Created " + s.id);
      onCreated(s);
    } catch (err) {
      st.error(err);
    }
  });
  return form;
}

// POST /v1/sessions/{id}/restore: a new session from an archive that DELETE ?archive=true made.
function restoreForm(onRestored: (s: Session) => void): HTMLElement {
  const st = status();
  const form = h(
    "form",
    { class: "create", "aria-label": "restore a session" },
    h("label", {}, "Id", h("input", { name: "id", required: "", pattern: "[A-Za-z0-9._\\-]{1,128}" })),
    h("label", {}, "Archive", h("input", { name: "archive", required: "", class: "wide", placeholder: "data_dir/archives/<id>-<time>.tar.zst" })),
    h("button", { type: "submit", class: "primary" }, "Restore"),
    st.el,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const d = new FormData(form);
    try {
      const s = await post("/v1/sessions/" + enc(String(d.get("id")).trim()) + "/restore", { archive: String(d.get("archive")).trim() });
      st.ok("Restored " + s.id);
      onRestored(s);
    } catch (err) {
      st.error(err);
    }
  });
  return form;
}

export function sessionsPage(main: HTMLElement, onCleanup: (c: Cleanup) => void): void {
  const sessions = new Map<string, Session>();
  const st = status();
  const live = h("span", { class: "live", title: "live updates from /v1/events" }, "connecting…");
  const stateSel = h(
    "select",
    { "aria-label": "filter by state" },
    ...["", "running", "suspended", "creating", "stopped"].map((s) => h("option", { value: s }, s || "any state")),
  );
  const labelIn = h("input", { type: "search", placeholder: "label k=v", "aria-label": "filter by label" });
  const idIn = h("input", { type: "search", placeholder: "id contains", "aria-label": "filter by id" });
  // An admin sees every tenant's sessions; in a cluster each session names its node.
  const tenantIn = h("input", { type: "search", placeholder: "tenant", "aria-label": "filter by tenant", size: 10 });
  const nodeIn = h("input", { type: "search", placeholder: "node", "aria-label": "filter by node", size: 10 });
  const count = h("span", { class: "muted" });
  const body = h("div", { class: "vbody", role: "rowgroup" });
  const spacer = h("div", { class: "vspacer" }, body);
  const scroller = h("div", { class: "vscroll", tabindex: "0", role: "table", "aria-label": "sessions" }, spacer);
  let visible: Session[] = [];

  function matches(s: Session): boolean {
    if (stateSel.value && s.state !== stateSel.value) return false;
    const id = idIn.value.trim();
    if (id && !String(s.id).includes(id)) return false;
    const tenant = tenantIn.value.trim();
    if (tenant && s.tenant !== tenant) return false;
    const node = nodeIn.value.trim();
    if (node && s.node !== node) return false;
    const lf = labelIn.value.trim();
    if (lf) {
      const [k, v] = lf.split("=");
      const have = (s.labels || {})[k.trim()];
      if (have === undefined) return false;
      if (v !== undefined && v.trim() && have !== v.trim()) return false;
    }
    return true;
  }

  function row(s: Session, i: number): HTMLElement {
    const act = (label: string, a: "suspend" | "resume" | "destroy") =>
      h(
        "button",
        {
          class: a === "destroy" ? "danger small" : "small",
          "data-action": a,
          onclick: async (e: Event) => {
            e.stopPropagation();
            try {
              await sessionAction(s.id, a);
            } catch (err) {
              st.error(err);
            }
          },
        },
        label,
      );
    return h(
      "div",
      { class: "vrow", role: "row", style: `top:${i * ROW}px`, "data-id": s.id },
      h("span", { class: "c-id", role: "cell" }, h("a", { href: "#/sessions/" + enc(s.id) }, s.id)),
      h("span", { class: "c-state", role: "cell" }, h("span", { class: "badge " + s.state }, s.state)),
      h("span", { class: "c-backend", role: "cell", title: s.node ? "on node " + s.node : undefined }, s.backend + (s.node ? " @ " + s.node : "")),
      h("span", { class: "c-age", role: "cell", title: s.created_at }, fmtAge(s.created_at)),
      h("span", { class: "c-ttl", role: "cell" }, ttlText(s)),
      h("span", { class: "c-limits", role: "cell" }, limitsText(s.limits)),
      h("span", { class: "c-labels", role: "cell" }, labelsText(s.labels)),
      h(
        "span",
        { class: "c-actions", role: "cell" },
        s.state === "running" ? act("Suspend", "suspend") : act("Resume", "resume"),
        act("Destroy", "destroy"),
      ),
    );
  }

  // Only the rows in view (plus a margin) are in the DOM.
  function paint(): void {
    const first = Math.max(0, Math.floor(scroller.scrollTop / ROW) - 5);
    const n = Math.ceil(scroller.clientHeight / ROW) + 10;
    clear(body);
    for (let i = first; i < Math.min(visible.length, first + n); i++) body.appendChild(row(visible[i], i));
  }

  function refresh(): void {
    visible = [...sessions.values()].filter(matches).sort((a, b) => String(a.id).localeCompare(String(b.id)));
    spacer.style.height = visible.length * ROW + "px";
    count.textContent = visible.length + " of " + sessions.size + " sessions";
    paint();
  }

  let frame = 0;
  const schedule = () => {
    if (!frame) frame = requestAnimationFrame(() => ((frame = 0), refresh()));
  };
  scroller.addEventListener("scroll", () => requestAnimationFrame(paint));
  window.addEventListener("resize", paint);
  for (const el of [stateSel, labelIn, idIn, tenantIn, nodeIn]) el.addEventListener("input", refresh);

  const header = h(
    "div",
    { class: "vhead", role: "row" },
    ...["Id", "State", "Backend", "Age", "TTL", "Limits", "Labels", ""].map((t, i) =>
      h("span", { role: "columnheader", class: ["c-id", "c-state", "c-backend", "c-age", "c-ttl", "c-limits", "c-labels", "c-actions"][i] }, t),
    ),
  );
  main.append(
    h("h1", {}, "Sessions ", live),
    h("details", { class: "card" }, h("summary", {}, "New session"), createForm((s) => ((location.hash = "#/sessions/" + enc(s.id))))),
    h("details", { class: "card" }, h("summary", {}, "Restore from an archive"), restoreForm((s) => ((location.hash = "#/sessions/" + enc(s.id))))),
    h("div", { class: "filters" }, stateSel, labelIn, idIn, tenantIn, nodeIn, count),
    st.el,
    h("div", { class: "vtable" }, header, scroller),
  );

  // The list, then the live stream. A dropped stream reconnects (with a fresh list, so nothing
  // that happened in between is missed).
  let ws: WebSocket | null = null;
  let stopped = false;
  let backoff = 500;
  const tick = setInterval(paint, 10000); // ages and TTLs move; this redraws, it does not fetch
  async function connect(): Promise<void> {
    if (stopped) return;
    try {
      const sock = await socket("/v1/events");
      if (stopped) {
        sock.close();
        return;
      }
      ws = sock;
      sock.onopen = async () => {
        backoff = 500;
        live.textContent = "live";
        live.className = "live on";
        try {
          const r = await get("/v1/sessions");
          sessions.clear();
          for (const s of r.sessions) sessions.set(s.id, s);
          schedule();
        } catch (err) {
          st.error(err);
        }
      };
      sock.onmessage = (m) => {
        const ev = JSON.parse(m.data);
        if (ev.event === "destroyed") sessions.delete(ev.session.id);
        else sessions.set(ev.session.id, ev.session);
        schedule();
      };
      sock.onclose = () => {
        live.textContent = "reconnecting…";
        live.className = "live";
        if (!stopped) setTimeout(connect, (backoff = Math.min(backoff * 2, 10000)));
      };
    } catch (err) {
      st.error(err);
      if (!stopped) setTimeout(connect, (backoff = Math.min(backoff * 2, 10000)));
    }
  }
  connect();
  onCleanup(() => {
    stopped = true;
    clearInterval(tick);
    window.removeEventListener("resize", paint);
    ws?.close();
  });
}
