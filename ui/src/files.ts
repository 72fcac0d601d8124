// The file browser of a session: list, open a directory, view and edit small text files,
// upload by drag and drop (or the picker), download, mkdir, rename, delete.
import { api, enc, get, post, request } from "./api";
import { clear, fmtAge, fmtBytes, h, status } from "./dom";
import { confirmDialog, promptDialog } from "./modal";

const MAX_EDIT = 1 << 20; // bytes: bigger files are downloaded, not edited here

function join(dir: string, name: string): string {
  return dir.endsWith("/") ? dir + name : dir + "/" + name;
}
function parent(p: string): string {
  const i = p.replace(/\/+$/, "").lastIndexOf("/");
  return i <= 0 ? "/" : p.slice(0, i);
}

export function filesView(id: string): HTMLElement {
  const base = "/v1/sessions/" + enc(id);
  let cwd = "/workspace";
  const st = status();
  const pathIn = h("input", { type: "text", class: "wide", "aria-label": "directory", value: cwd });
  const list = h("ul", { class: "files", "aria-label": "files" });
  const editor = h("div", { class: "editor", hidden: true });
  const picker = h("input", { type: "file", multiple: true, hidden: true, "aria-label": "upload files" });
  const drop = h("div", { class: "drop", tabindex: "-1" }, list, h("p", { class: "muted hint" }, "Drop files here to upload them into this directory."));

  async function load(dir = cwd): Promise<void> {
    st.clear();
    try {
      const r = await get(base + "/dir?path=" + enc(dir));
      cwd = dir;
      pathIn.value = dir;
      clear(list);
      // eslint-disable-next-line @typescript-eslint/no-explicit-any
      const entries = (r.entries as any[]).sort((a, b) => Number(b.is_dir) - Number(a.is_dir) || a.name.localeCompare(b.name));
      if (dir !== "/") list.appendChild(h("li", {}, h("button", { class: "link", onclick: () => load(parent(dir)) }, "..")));
      for (const e of entries) list.appendChild(entry(e));
      if (!entries.length) list.appendChild(h("li", { class: "muted" }, "(empty)"));
    } catch (err) {
      st.error(err);
    }
  }

  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  function entry(e: any): HTMLElement {
    const p = join(cwd, e.name);
    const open = h(
      "button",
      { class: "link" + (e.is_dir ? " dir" : ""), onclick: () => (e.is_dir ? load(p) : view(p, e.size)) },
      e.name + (e.is_dir ? "/" : ""),
    );
    const btn = (label: string, f: () => void, cls = "small") => h("button", { class: cls, onclick: f, "aria-label": label + " " + e.name }, label);
    return h(
      "li",
      { "data-name": e.name },
      open,
      h("span", { class: "muted" }, e.is_dir ? "" : fmtBytes(e.size)),
      h("span", { class: "muted" }, fmtAge(e.mod_time)),
      h(
        "span",
        { class: "acts" },
        e.is_dir ? null : btn("Download", () => download(p, e.name)),
        btn("Rename", () => rename(p, e.name)),
        btn("Delete", () => remove(p, e.is_dir), "small danger"),
      ),
    );
  }

  async function view(p: string, size: number): Promise<void> {
    if (size > MAX_EDIT) {
      st.error(p + " is " + fmtBytes(size) + ": too big to edit here; download it instead");
      return;
    }
    try {
      const res = await request("GET", base + "/files?path=" + enc(p));
      const bytes = new Uint8Array(await res.arrayBuffer());
      let text: string;
      try {
        text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
      } catch {
        st.error(p + " is not UTF-8 text; download it instead");
        return;
      }
      const area = h("textarea", { class: "code", spellcheck: "false", "aria-label": "contents of " + p });
      area.value = text;
      const save = h("button", { class: "primary" }, "Save");
      const close = h("button", {}, "Close");
      const est = status();
      save.addEventListener("click", async () => {
        try {
          await request("PUT", base + "/files?path=" + enc(p), { raw: area.value });
          est.ok("Saved " + p);
          load();
        } catch (err) {
          est.error(err);
        }
      });
      close.addEventListener("click", () => (editor.hidden = true));
      clear(editor);
      editor.append(h("h3", {}, p), area, h("div", { class: "row" }, save, close), est.el);
      editor.hidden = false;
      area.focus();
    } catch (err) {
      st.error(err);
    }
  }

  async function download(p: string, name: string): Promise<void> {
    try {
      const res = await request("GET", base + "/files?path=" + enc(p));
      const url = URL.createObjectURL(await res.blob());
      const a = h("a", { href: url, download: name });
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (err) {
      st.error(err);
    }
  }

  async function rename(p: string, name: string): Promise<void> {
    const to = await promptDialog("Rename " + name + " to", name);
    if (!to || to === name) return;
    try {
      await post(base + "/rename", { from: p, to: to.startsWith("/") ? to : join(cwd, to) });
      load();
    } catch (err) {
      st.error(err);
    }
  }

  async function remove(p: string, dir: boolean): Promise<void> {
    if (!(await confirmDialog("Delete " + p + (dir ? " and everything in it" : "") + "?", "Delete"))) return;
    try {
      await api("DELETE", base + "/files?path=" + enc(p) + (dir ? "&recursive=true" : ""));
      load();
    } catch (err) {
      st.error(err);
    }
  }

  async function upload(files: FileList | File[]): Promise<void> {
    for (const f of Array.from(files)) {
      try {
        await request("PUT", base + "/files?path=" + enc(join(cwd, f.name)), { raw: f });
        st.ok("Uploaded " + f.name);
      } catch (err) {
        st.error(err);
      }
    }
    load();
  }

  drop.addEventListener("dragover", (e) => {
    e.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer?.files.length) upload(e.dataTransfer.files);
  });
  picker.addEventListener("change", () => picker.files && upload(picker.files));
  pathIn.addEventListener("keydown", (e) => e.key === "Enter" && load(pathIn.value.trim() || "/workspace"));

  const mkdir = async () => {
    const name = await promptDialog("New directory in " + cwd);
    if (!name) return;
    try {
      await post(base + "/mkdir", { path: name.startsWith("/") ? name : join(cwd, name) });
      load();
    } catch (err) {
      st.error(err);
    }
  };
  const el = h(
    "section",
    { class: "filebrowser" },
    h(
      "div",
      { class: "row" },
      pathIn,
      h("button", { onclick: () => load(pathIn.value.trim()) }, "Go"),
      h("button", { onclick: mkdir }, "New folder"),
      h("button", { onclick: () => picker.click() }, "Upload…"),
      h("button", { onclick: () => load() }, "Refresh"),
      picker,
    ),
    st.el,
    drop,
    editor,
  );
  load();
  return el;
}
