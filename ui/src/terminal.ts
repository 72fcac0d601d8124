// A terminal into the session: xterm.js over the pty WebSocket (binary frames both ways,
// {"type":"resize"} text frames). xterm gets bytes, never markup. A dropped socket reconnects
// to a new shell after a short wait; a shell that exits says so and offers a new one.
import { FitAddon } from "@xterm/addon-fit";
import { Terminal } from "@xterm/xterm";
import { enc, socket } from "./api";
import { h } from "./dom";

export function terminalView(id: string): { el: HTMLElement; stop: () => void } {
  const host = h("div", { class: "term" });
  const state = h("span", { class: "muted", role: "status" }, "connecting…");
  const again = h("button", { class: "small", hidden: true }, "New shell");
  const el = h("section", { class: "terminal" }, h("div", { class: "row" }, state, again), host);
  const term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000, convertEol: false });
  const fit = new FitAddon();
  term.loadAddon(fit);
  let ws: WebSocket | null = null;
  let stopped = false;
  let opened = false;
  const encoder = new TextEncoder();

  const sendResize = () => {
    if (ws && ws.readyState === WebSocket.OPEN) {
      ws.send(JSON.stringify({ type: "resize", cols: term.cols, rows: term.rows }));
    }
  };
  const refit = () => {
    try {
      fit.fit();
    } catch {
      // not laid out yet
    }
  };
  term.onData((d) => ws?.readyState === WebSocket.OPEN && ws.send(encoder.encode(d)));
  term.onResize(sendResize);
  const ro = new ResizeObserver(refit);

  async function connect(): Promise<void> {
    if (stopped) return;
    again.hidden = true;
    state.textContent = "connecting…";
    try {
      refit();
      const sock = await socket(
        "/v1/sessions/" + enc(id) + "/pty?cols=" + term.cols + "&rows=" + term.rows,
      );
      if (stopped) {
        sock.close();
        return;
      }
      ws = sock;
      sock.binaryType = "arraybuffer";
      sock.onopen = () => {
        state.textContent = "connected";
        term.focus();
        sendResize();
      };
      sock.onmessage = (m) => {
        if (typeof m.data === "string") term.write(m.data);
        else term.write(new Uint8Array(m.data as ArrayBuffer));
      };
      sock.onclose = (e) => {
        if (stopped) return;
        if (e.code === 1000) {
          state.textContent = "shell ended (" + (e.reason || "closed") + ")";
          again.hidden = false;
        } else {
          state.textContent = "disconnected" + (e.reason ? ": " + e.reason : "") + "; reconnecting…";
          setTimeout(connect, 2000);
        }
      };
    } catch (err) {
      state.textContent = err instanceof Error ? err.message : String(err);
      again.hidden = false;
    }
  }
  again.addEventListener("click", () => {
    term.reset();
    connect();
  });
  // Opened once the element is in the document (xterm measures its font there).
  requestAnimationFrame(() => {
    if (stopped || opened) return;
    opened = true;
    term.open(host);
    ro.observe(host);
    refit();
    connect();
  });
  return {
    el,
    stop() {
      stopped = true;
      ro.disconnect();
      ws?.close();
      term.dispose();
    },
  };
}
