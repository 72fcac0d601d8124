// A session's usage (GET /v1/sessions/{id}/usage): CPU, memory, tasks and workspace size, each
// with a chart of the last five minutes, sampled every 3 s while the session page is open.
// Asking is not a use of the session: watching it does not keep it alive.
import { ApiError, api, enc } from "./api";
import { clear, fmtBytes, h, spark } from "./dom";

const EVERY_MS = 3000;
const KEEP = 100; // samples: five minutes

type Limits = { memory_mb?: number; cpu_percent?: number; max_pids?: number; disk_mb?: number };
type Row = { key: string; label: string; values: number[]; text: string; max?: number };

export function usageView(id: string, limits: () => Limits): { el: HTMLElement; stop: () => void } {
  const body = h("div", { class: "usage", id: "usage" });
  const rows: Record<string, Row> = {
    cpu: { key: "cpu", label: "CPU", values: [], text: "—" },
    memory: { key: "memory", label: "Memory", values: [], text: "—" },
    pids: { key: "pids", label: "Tasks", values: [], text: "—" },
    disk: { key: "disk", label: "Workspace", values: [], text: "—" },
  };
  let last: { cpu: number; at: number } | null = null;
  let stopped = false;
  const ctl = new AbortController(); // stop() also ends a sample in flight
  let timer: ReturnType<typeof setTimeout> | undefined;

  const push = (r: Row, v: number) => {
    r.values.push(v);
    if (r.values.length > KEEP) r.values.shift();
  };

  function paint(note?: string): void {
    clear(body);
    if (note) {
      body.append(h("p", { class: "muted" }, note));
      return;
    }
    for (const r of Object.values(rows)) {
      body.append(h("div", { class: "meter", id: "usage-" + r.key }, h("span", { class: "muted" }, r.label), h("b", {}, r.text), spark(r.values, r.max)));
    }
  }

  async function sample(): Promise<void> {
    try {
      const u = await api("GET", "/v1/sessions/" + enc(id) + "/usage", { signal: ctl.signal });
      const l = limits();
      const now = performance.now();
      if (u.state !== "running") {
        last = null;
        rows.cpu.text = "suspended";
        push(rows.cpu, 0);
      } else if (typeof u.cpu_usec === "number") {
        if (last && now > last.at) {
          const pct = ((u.cpu_usec - last.cpu) / ((now - last.at) * 1000)) * 100;
          push(rows.cpu, Math.max(0, pct));
          rows.cpu.text = pct.toFixed(1) + " %" + (l.cpu_percent ? " of " + l.cpu_percent + " %" : "");
        }
        last = { cpu: u.cpu_usec, at: now };
      }
      rows.cpu.max = l.cpu_percent || 100;
      push(rows.memory, u.memory_bytes);
      rows.memory.max = l.memory_mb ? l.memory_mb * 1048576 : undefined;
      rows.memory.text = fmtBytes(u.memory_bytes) + (l.memory_mb ? " of " + fmtBytes(l.memory_mb * 1048576) : "");
      push(rows.pids, u.pids);
      rows.pids.max = l.max_pids || undefined;
      rows.pids.text = u.pids + (l.max_pids ? " of " + l.max_pids : "");
      if (u.workspace_bytes === null) {
        rows.disk.text = "a host directory";
      } else {
        push(rows.disk, u.workspace_bytes);
        rows.disk.max = l.disk_mb ? l.disk_mb * 1048576 : undefined;
        rows.disk.text = fmtBytes(u.workspace_bytes) + (l.disk_mb ? " of " + fmtBytes(l.disk_mb * 1048576) : "");
      }
      paint();
    } catch (err) {
      if (stopped) return;
      if (err instanceof ApiError && (err.status === 501 || err.status === 404)) {
        paint(err.message); // e.g. "usage on the host backend …": nothing to poll
        return;
      }
      paint("Usage: " + (err instanceof Error ? err.message : String(err)));
    }
    if (!stopped) timer = setTimeout(sample, EVERY_MS);
  }
  paint();
  sample();
  return {
    el: body,
    stop: () => {
      stopped = true;
      ctl.abort();
      if (timer !== undefined) clearTimeout(timer);
    },
  };
}
