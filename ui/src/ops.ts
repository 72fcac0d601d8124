// Operations: readiness and features, connected runners, the audit log (GET /v1/audit, with
// filters), the daemon's metrics (GET /metrics, Prometheus text, with a small live chart of each
// series while the page is open).
import { api, enc, get, request } from "./api";
import { clear, fmtAge, fmtBytes, h, spark, status } from "./dom";
import type { Cleanup } from "./main";

type Sample = { name: string; labels: string; value: number };

export function parseMetrics(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (m) out.push({ name: m[1], labels: m[2] || "", value: Number(m[3]) });
  }
  return out;
}

export function opsPage(main: HTMLElement, onCleanup: (c: Cleanup) => void): void {
  const st = status();
  const ready = h("div");
  const runners = h("tbody");
  const metrics = h("tbody");
  const filter = h("input", { type: "search", placeholder: "filter metrics", "aria-label": "filter metrics" });
  const history = new Map<string, number[]>();
  let last: Sample[] = [];

  // GET /v1/cluster: this daemon alone, or every node of the cluster with its load; an admin
  // may cordon a node (no new sessions) and uncordon it.
  const nodes = h("tbody", { id: "nodes" });
  const clusterNote = h("p", { class: "muted" });
  async function loadCluster(): Promise<void> {
    try {
      const c = await get("/v1/cluster");
      clear(nodes);
      clusterNote.textContent =
        c.mode === "single" ? "A single daemon (no cluster configured)." : "A cluster on etcd (" + (c.etcd?.endpoints || []).join(", ") + "): " + (c.etcd?.healthy ? "etcd healthy" : "etcd unreachable");
      // eslint-disable-next-line @typescript-eslint/no-explicit-any
      for (const n of c.nodes as any[]) {
        const act = (what: "cordon" | "uncordon") =>
          h(
            "button",
            {
              onclick: async () => {
                try {
                  await api("POST", "/v1/cluster/nodes/" + enc(n.name) + "/" + what, { body: {} });
                  loadCluster();
                } catch (err) {
                  st.error(err);
                }
              },
            },
            what === "cordon" ? "Cordon" : "Uncordon",
          );
        nodes.appendChild(
          h(
            "tr",
            {},
            h("td", {}, n.name, n.name === c.node ? " (this one)" : ""),
            h("td", {}, h("span", { class: "badge " + (n.state === "up" ? "running" : n.state === "down" ? "failed" : "suspended") }, n.state)),
            h("td", { class: "mono" }, n.advertise || ""),
            h("td", {}, String(n.sessions ?? "")),
            h("td", {}, String(n.running_boxes ?? "")),
            h("td", {}, n.free_memory_mb !== undefined ? fmtBytes(n.free_memory_mb * 1048576) : ""),
            h("td", {}, n.version || ""),
            h("td", {}, c.mode === "single" ? "" : n.state === "cordoned" ? act("uncordon") : n.state === "up" ? act("cordon") : ""),
          ),
        );
      }
    } catch (err) {
      st.error(err);
    }
  }

  async function loadStatic(): Promise<void> {
    try {
      const r = await get("/readyz");
      clear(ready);
      ready.append(
        h("p", {}, h("span", { class: "badge running" }, "ready"), " default backend ", h("b", {}, r.backend), "; usable: ", (r.backends || []).join(", ")),
      );
    } catch (err) {
      clear(ready);
      ready.append(h("p", {}, h("span", { class: "badge failed" }, "not ready"), " ", err instanceof Error ? err.message : String(err)));
    }
    try {
      const r = await get("/v1/runners");
      clear(runners);
      for (const x of r.runners) {
        runners.appendChild(
          h("tr", {}, h("td", {}, x.user), h("td", {}, x.connected ? "connected" : "offline"), h("td", { class: "mono" }, x.workspace || ""), h("td", {}, x.version || ""), h("td", {}, fmtAge(x.last_seen))),
        );
      }
      if (!r.runners.length) runners.appendChild(h("tr", {}, h("td", { colspan: "5", class: "muted" }, "No runner is configured for this tenant.")));
    } catch (err) {
      st.error(err);
    }
  }

  function paintMetrics(): void {
    clear(metrics);
    const f = filter.value.trim();
    for (const s of last) {
      const key = s.name + s.labels;
      if (f && !key.includes(f)) continue;
      if (s.name.endsWith("_bucket")) continue;
      metrics.appendChild(h("tr", {}, h("td", { class: "mono" }, s.name), h("td", { class: "mono" }, s.labels), h("td", {}, String(s.value)), h("td", {}, spark(history.get(key) || []))));
    }
  }

  async function loadMetrics(): Promise<void> {
    try {
      const res = await request("GET", "/metrics");
      last = parseMetrics(await res.text());
      for (const s of last) {
        const key = s.name + s.labels;
        const hist = history.get(key) || [];
        hist.push(s.value);
        if (hist.length > 60) hist.shift();
        history.set(key, hist);
      }
      paintMetrics();
    } catch (err) {
      st.error(err);
    }
  }
  filter.addEventListener("input", paintMetrics);

  const audit = h("tbody");
  const aEvent = h("input", { type: "search", placeholder: "event prefix, e.g. session.", "aria-label": "audit event" });
  const aSession = h("input", { type: "search", placeholder: "session id", "aria-label": "audit session" });
  const aLimit = h("select", { "aria-label": "audit lines" }, ...["50", "200", "1000"].map((n) => h("option", { selected: n === "200" }, n)));
  async function loadAudit(): Promise<void> {
    let q = "?limit=" + aLimit.value;
    if (aEvent.value.trim()) q += "&event=" + enc(aEvent.value.trim());
    if (aSession.value.trim()) q += "&session=" + enc(aSession.value.trim());
    try {
      const r = await get("/v1/audit" + q);
      clear(audit);
      // eslint-disable-next-line @typescript-eslint/no-explicit-any
      for (const l of [...r.lines].reverse() as any[]) {
        const { time, event, tenant, session, ...rest } = l;
        audit.appendChild(
          h("tr", {}, h("td", { title: time }, fmtAge(time) + " ago"), h("td", {}, event), h("td", {}, tenant), h("td", {}, session), h("td", { class: "mono" }, JSON.stringify(rest))),
        );
      }
      if (!r.lines.length) audit.appendChild(h("tr", {}, h("td", { colspan: "5", class: "muted" }, "No audit lines match.")));
    } catch (err) {
      st.error(err);
    }
  }
  const auditForm = h("form", { class: "filters", "aria-label": "audit filters" }, aEvent, aSession, aLimit, h("button", { type: "submit" }, "Show"));
  auditForm.addEventListener("submit", (e) => {
    e.preventDefault();
    loadAudit();
  });

  main.append(
    h("h1", {}, "Operations"),
    st.el,
    ready,
    h("h2", {}, "Runners"),
    h("table", {}, h("thead", {}, h("tr", {}, ...["User", "State", "Workspace", "Version", "Last seen"].map((x) => h("th", {}, x)))), runners),
    h("h2", {}, "Nodes"),
    clusterNote,
    h("table", {}, h("thead", {}, h("tr", {}, ...["Node", "State", "Address", "Sessions", "Running", "Free memory", "Version", ""].map((x) => h("th", {}, x)))), nodes),
    h("h2", {}, "Audit log"),
    auditForm,
    h("table", { class: "audit" }, h("thead", {}, h("tr", {}, ...["When", "Event", "Tenant", "Session", "Details"].map((x) => h("th", {}, x)))), audit),
    h("h2", {}, "Metrics"),
    h("div", { class: "filters" }, filter, h("span", { class: "muted" }, "every 5 s while this page is open")),
    h("table", { class: "metrics" }, h("thead", {}, h("tr", {}, ...["Series", "Labels", "Value", "Last 5 min"].map((x) => h("th", {}, x)))), metrics),
  );
  loadStatic();
  loadCluster();
  loadAudit();
  loadMetrics();
  const t = setInterval(loadMetrics, 5000);
  onCleanup(() => clearInterval(t));
}
