// The daemon's API as the dashboard uses it. SECURITY (API.md "Dashboard", SECURITY.md T13):
// the token lives in sessionStorage only (gone with the tab, never localStorage, never a
// cookie) and goes out in the Authorization header only; WebSockets, which cannot carry that
// header, get a single-use ticket from POST /v1/ws-tickets in their URL instead.

const KEY = "agentbox.token";

export function token(): string | null {
  return sessionStorage.getItem(KEY);
}
export function setToken(t: string): void {
  sessionStorage.setItem(KEY, t);
}
export function logout(): void {
  sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(
    public status: number,
    public code: string,
    message: string,
  ) {
    super(message);
  }
}

function headers(extra: Record<string, string> = {}, t = token()): Record<string, string> {
  const hd: Record<string, string> = { ...extra };
  if (t) hd["Authorization"] = "Bearer " + t;
  return hd;
}

async function failure(res: Response, stored: boolean): Promise<ApiError> {
  let code = "E" + res.status;
  let message = res.statusText || "HTTP " + res.status;
  try {
    const j = await res.json();
    if (j && j.error) {
      code = j.error.code || code;
      message = j.error.message || message;
    }
  } catch {
    // not JSON: keep the status text
  }
  if (res.status === 401 && stored) onUnauthorized();
  return new ApiError(res.status, code, message);
}

let onUnauthorized: () => void = () => {};
export function setUnauthorizedHandler(f: () => void): void {
  onUnauthorized = f;
}

export interface Opts {
  body?: unknown;
  raw?: BodyInit;
  type?: string;
  signal?: AbortSignal;
  token?: string;
  accept?: string;
}

export async function request(method: string, path: string, o: Opts = {}): Promise<Response> {
  const extra: Record<string, string> = {};
  let body: BodyInit | undefined;
  if (o.raw !== undefined) {
    body = o.raw;
    extra["Content-Type"] = o.type || "application/octet-stream";
  } else if (o.body !== undefined) {
    body = JSON.stringify(o.body);
    extra["Content-Type"] = "application/json";
  }
  if (o.accept) extra["Accept"] = o.accept;
  const res = await fetch(path, {
    method,
    body,
    headers: headers(extra, o.token ?? token()),
    signal: o.signal,
    credentials: "omit",
    cache: "no-store",
    referrerPolicy: "no-referrer",
  });
  if (!res.ok) throw await failure(res, o.token === undefined);
  return res;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export async function api(method: string, path: string, o: Opts = {}): Promise<any> {
  const res = await request(method, path, o);
  const text = await res.text();
  return text ? JSON.parse(text) : {};
}

export const get = (p: string) => api("GET", p);
export const post = (p: string, body: unknown = {}) => api("POST", p, { body });

export function enc(s: string): string {
  return encodeURIComponent(s);
}

// Reads an NDJSON reply line by line until it ends or `signal` aborts (a GET, or `method` with
// a JSON `body`, e.g. an image pull's progress).
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export async function ndjson(path: string, onLine: (j: any) => void, signal: AbortSignal, method = "GET", body?: unknown): Promise<void> {
  const res = await request(method, path, { signal, body, accept: "application/x-ndjson" });
  if (!res.body) return;
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let nl: number;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (line.trim()) onLine(JSON.parse(line));
    }
  }
  if (buf.trim()) onLine(JSON.parse(buf));
}

// A WebSocket to `path` (which may carry its own query), authenticated by a fresh ticket.
export async function socket(path: string): Promise<WebSocket> {
  const t = await post("/v1/ws-tickets");
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const sep = path.includes("?") ? "&" : "?";
  return new WebSocket(proto + "//" + location.host + path + sep + "ticket=" + enc(t.ticket));
}
