// Building DOM nodes. Text always goes in as text (textContent / text nodes), never as markup:
// file names, process output and API messages cannot inject HTML (SECURITY.md T13).

type Child = Node | string | number | null | undefined | false;
type Attrs = Record<string, string | number | boolean | EventListener | undefined | null>;

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: (Child | Child[])[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") {
      el.addEventListener(k.slice(2).toLowerCase(), v as EventListener);
    } else if (k === "class") {
      el.className = String(v);
    } else if (v === true) {
      el.setAttribute(k, "");
    } else {
      el.setAttribute(k, String(v));
    }
  }
  append(el, children);
  return el;
}

export function append(el: Node, children: (Child | Child[])[]): void {
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
  }
}

export function clear(el: Node): void {
  while (el.firstChild) el.removeChild(el.firstChild);
}

export function fmtBytes(n: number | undefined | null): string {
  if (n === undefined || n === null) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return (i === 0 ? String(v) : v.toFixed(1)) + " " + units[i];
}

// A small line chart of `values` (oldest first), scaled to `max` (default: their largest).
export function spark(values: number[], max?: number): SVGElement {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 120 24");
  svg.setAttribute("class", "spark");
  const top = Math.max(max ?? 0, 1e-9, ...values);
  const pts = values.map((v, i) => `${(i * 120) / Math.max(1, values.length - 1)},${24 - (v / top) * 22 - 1}`).join(" ");
  const pl = document.createElementNS(ns, "polyline");
  pl.setAttribute("points", pts);
  svg.appendChild(pl);
  return svg;
}

export function fmtAge(iso: string | undefined): string {
  if (!iso) return "—";
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return "—";
  let s = Math.max(0, Math.round((Date.now() - t) / 1000));
  if (s < 60) return s + "s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m";
  const hr = Math.floor(m / 60);
  if (hr < 48) return hr + "h " + (m % 60) + "m";
  s = Math.floor(hr / 24);
  return s + "d";
}

// A status line under a form: an error in words (the API's message) or a success note.
export function status(): { el: HTMLElement; error(e: unknown): void; ok(t: string): void; clear(): void } {
  const el = h("p", { class: "status", role: "status", "aria-live": "polite" });
  return {
    el,
    error(e: unknown) {
      el.className = "status error";
      el.textContent = e instanceof Error ? e.message : String(e);
    },
    ok(t: string) {
      el.className = "status ok";
      el.textContent = t;
    },
    clear() {
      el.className = "status";
      el.textContent = "";
    },
  };
}
