// Templates: the list, a template's versions (snapshots) with rollback, push a YAML template
// (the API's validation error shown as it says it, line and all), build with the log streaming.
import { api, enc, get, ndjson, post } from "./api";
import { clear, fmtAge, fmtBytes, h, status } from "./dom";
import type { Cleanup } from "./main";

const EXAMPLE = `name: hello
version: 1
description: a small example
files:
  hello.txt: "hello from the template\\n"
setup:
  - echo built > /workspace/built.txt
`;

export function templatesPage(main: HTMLElement, onCleanup: (c: Cleanup) => void): void {
  const st = status();
  const list = h("tbody");
  const detail = h("div", { class: "card", hidden: true });
  const log = h("pre", { class: "log", "aria-label": "build log", tabindex: "0" });
  let build: AbortController | null = null;
  onCleanup(() => build?.abort());

  async function load(): Promise<void> {
    try {
      const r = await get("/v1/templates");
      clear(list);
      for (const t of r.templates) {
        list.appendChild(
          h(
            "tr",
            { "data-name": t.name },
            h("td", {}, h("button", { class: "link", onclick: () => open(t.name) }, t.name)),
            h("td", {}, t.current_version ?? "not built"),
            h("td", {}, t.description),
            h("td", {}, fmtAge(t.updated_at)),
            h("td", {}, h("button", { class: "small primary", onclick: () => startBuild(t.name) }, "Build")),
          ),
        );
      }
      if (!r.templates.length) list.appendChild(h("tr", {}, h("td", { colspan: "5", class: "muted" }, "No templates yet: push one below.")));
    } catch (err) {
      st.error(err);
    }
  }

  async function open(name: string): Promise<void> {
    try {
      const [t, s] = await Promise.all([get("/v1/templates/" + enc(name)), get("/v1/templates/" + enc(name) + "/snapshots")]);
      clear(detail);
      detail.hidden = false;
      detail.append(
        h("h2", {}, t.name),
        h("p", {}, t.description || ""),
        t.warnings?.length ? h("ul", { class: "warn" }, ...t.warnings.map((w: string) => h("li", {}, w))) : "",
        h(
          "table",
          {},
          h("thead", {}, h("tr", {}, ...["Version", "Built", "Size", "Files", ""].map((x) => h("th", {}, x)))),
          h(
            "tbody",
            {},
            // eslint-disable-next-line @typescript-eslint/no-explicit-any
            ...s.snapshots.map((v: any) =>
              h(
                "tr",
                {},
                h("td", {}, String(v.version), v.current ? " (current)" : ""),
                h("td", {}, fmtAge(v.created_at) + " ago"),
                h("td", {}, fmtBytes(v.bytes)),
                h("td", {}, String(v.files)),
                h("td", {}, v.current ? null : h("button", { class: "small", onclick: () => rollback(name, v.version) }, "Make current")),
              ),
            ),
          ),
        ),
      );
    } catch (err) {
      st.error(err);
    }
  }

  async function rollback(name: string, version: number): Promise<void> {
    try {
      await post("/v1/templates/" + enc(name) + "/rollback", { version });
      st.ok(name + ": version " + version + " is current");
      open(name);
      load();
    } catch (err) {
      st.error(err);
    }
  }

  async function startBuild(name: string): Promise<void> {
    build?.abort();
    const ctl = new AbortController();
    build = ctl;
    log.textContent = "";
    try {
      const b = await post("/v1/templates/" + enc(name) + "/build");
      st.ok("Building " + name + " (" + b.build_id + ")");
      await ndjson(
        "/v1/templates/" + enc(name) + "/builds/" + enc(b.build_id) + "/log?follow=true",
        (j) => {
          if (j.type === "end") {
            log.textContent += "\n[build " + j.state + (j.exit_code !== null && j.exit_code !== undefined ? ", exit " + j.exit_code : "") + "]\n";
            if (j.state === "succeeded") st.ok("Built " + name);
            else st.error("Build of " + name + " " + j.state);
            load();
          } else {
            log.textContent += (j.line ?? JSON.stringify(j)) + "\n";
          }
          log.scrollTop = log.scrollHeight;
        },
        ctl.signal,
      );
    } catch (err) {
      if (!ctl.signal.aborted) st.error(err);
    }
  }

  const yaml = h("textarea", { class: "code", spellcheck: "false", rows: "12", "aria-label": "template YAML" });
  yaml.value = EXAMPLE;
  const pst = status();
  const push = h("button", { class: "primary" }, "Push");
  push.addEventListener("click", async () => {
    pst.clear();
    try {
      const t = await api("POST", "/v1/templates", { raw: yaml.value, type: "application/yaml" });
      pst.ok("Pushed " + t.name + (t.warnings?.length ? " — " + t.warnings.join("; ") : ""));
      load();
    } catch (err) {
      pst.error(err);
      markLine(err instanceof Error ? err.message : String(err));
    }
  });
  // The daemon's YAML errors name their line ("line 7: …"): that line is shown under the
  // editor with its number and selected in it.
  const where = h("pre", { class: "code", id: "yaml-error", hidden: true });
  function markLine(message: string): void {
    const m = /line (\d+)/.exec(message);
    where.hidden = !m;
    if (!m) return;
    const n = Number(m[1]);
    const lines = yaml.value.split("\n");
    if (n < 1 || n > lines.length) return;
    where.textContent = n + " | " + lines[n - 1] + "\n" + " ".repeat(String(n).length) + " | ^ " + message;
    const start = lines.slice(0, n - 1).reduce((a, l) => a + l.length + 1, 0);
    yaml.focus();
    yaml.setSelectionRange(start, start + lines[n - 1].length);
  }
  yaml.addEventListener("input", () => (where.hidden = true));
  main.append(
    h("h1", {}, "Templates"),
    st.el,
    h("table", { class: "templates" }, h("thead", {}, h("tr", {}, ...["Name", "Current", "Description", "Updated", ""].map((x) => h("th", {}, x)))), list),
    detail,
    h("h2", {}, "Build log"),
    log,
    h("h2", {}, "Push a template"),
    yaml,
    h("div", { class: "row" }, push),
    pst.el,
    where,
  );
  load();
}
