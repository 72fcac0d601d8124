// Images (API.md "Images"): the images this daemon holds, pull one by reference with its
// progress streamed layer by layer, remove one (refused in words while a session uses it).
import { api, enc, get, ndjson } from "./api";
import { clear, fmtAge, fmtBytes, h, status } from "./dom";
import type { Cleanup } from "./main";
import { confirmDialog } from "./modal";

export function imagesPage(main: HTMLElement, onCleanup: (c: Cleanup) => void): void {
  const st = status();
  const list = h("tbody", { id: "images" });
  const progress = h("pre", { class: "log", id: "pull-log", "aria-label": "pull progress", tabindex: "0" });
  let pull: AbortController | null = null;
  onCleanup(() => pull?.abort());

  async function load(): Promise<void> {
    try {
      const r = await get("/v1/images");
      clear(list);
      // eslint-disable-next-line @typescript-eslint/no-explicit-any
      for (const i of r.images as any[]) {
        const rm = h("button", { class: "small danger" }, "Remove");
        rm.addEventListener("click", async () => {
          if (!(await confirmDialog("Remove image " + (i.refs || [i.ref]).join(", ") + " and the layers no other image has?", "Remove"))) return;
          try {
            await api("DELETE", "/v1/images/" + enc(i.digest));
            load();
          } catch (err) {
            st.error(err);
          }
        });
        list.appendChild(
          h(
            "tr",
            { "data-digest": i.digest },
            h("td", { class: "mono" }, (i.refs || [i.ref]).join(", ")),
            h("td", { class: "mono", title: i.digest }, String(i.digest).slice(0, 19) + "…"),
            h("td", {}, fmtBytes(i.size)),
            h("td", {}, String((i.layers || []).length)),
            h("td", {}, i.platform ? [i.platform.os, i.platform.architecture].filter(Boolean).join("/") : ""),
            h("td", { title: i.pulled_at }, fmtAge(i.pulled_at) + " ago"),
            h("td", {}, rm),
          ),
        );
      }
      if (!r.images.length) list.appendChild(h("tr", {}, h("td", { colspan: "7", class: "muted" }, "No images yet: pull one below.")));
    } catch (err) {
      st.error(err);
    }
  }

  const ref = h("input", { name: "ref", class: "wide", required: true, placeholder: "registry:5000/team/python:3.12", "aria-label": "image reference" });
  const pst = status();
  const form = h("form", { class: "row", "aria-label": "pull an image" }, ref, h("button", { type: "submit", class: "primary" }, "Pull"));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    pull?.abort();
    pull = new AbortController();
    pst.ok("Pulling " + ref.value.trim() + "…");
    progress.textContent = "";
    let failed = "";
    try {
      await ndjson(
        "/v1/images",
        (l) => {
          if (l.error) failed = l.error.message || String(l.error);
          else if (l.image) progress.textContent += "pulled " + l.image.digest + "\n";
          else if (l.layer) progress.textContent += l.layer + ": " + fmtBytes(l.bytes) + (l.total ? " of " + fmtBytes(l.total) : "") + "\n";
          progress.scrollTop = progress.scrollHeight;
        },
        pull.signal,
        "POST",
        { ref: ref.value.trim() },
      );
      if (failed) pst.error(failed);
      else pst.ok("Pulled " + ref.value.trim());
      load();
    } catch (err) {
      if (!pull.signal.aborted) pst.error(err);
    }
  });

  main.append(
    h("h1", {}, "Images"),
    st.el,
    h("table", {}, h("thead", {}, h("tr", {}, ...["References", "Digest", "Size", "Layers", "Platform", "Pulled", ""].map((x) => h("th", {}, x)))), list),
    h("h2", {}, "Pull an image"),
    form,
    pst.el,
    progress,
  );
  load();
}
