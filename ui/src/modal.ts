// Keyboard-usable dialogs on <dialog> (focus moves in, Escape cancels), for confirmations and
// short inputs.
import { h } from "./dom";

function open(body: HTMLElement[], okLabel: string, danger: boolean): Promise<boolean> {
  return new Promise((resolve) => {
    const ok = h("button", { type: "submit", class: danger ? "danger" : "primary", value: "ok" }, okLabel);
    const cancel = h("button", { type: "button", value: "cancel" }, "Cancel");
    const form = h("form", { method: "dialog" }, ...body, h("div", { class: "actions" }, cancel, ok));
    const dlg = h("dialog", { class: "modal" }, form);
    let result = false;
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      result = true;
      dlg.close();
    });
    cancel.addEventListener("click", () => dlg.close());
    dlg.addEventListener("close", () => {
      dlg.remove();
      resolve(result);
    });
    document.body.appendChild(dlg);
    dlg.showModal();
    const first = form.querySelector("input, textarea") as HTMLElement | null;
    (first || ok).focus();
  });
}

export function confirmDialog(text: string, okLabel = "OK", danger = true): Promise<boolean> {
  return open([h("p", {}, text)], okLabel, danger);
}

export async function promptDialog(label: string, value = ""): Promise<string | null> {
  const input = h("input", { type: "text", value, "aria-label": label, class: "wide" });
  const ok = await open([h("label", {}, label, input)], "OK", false);
  return ok ? input.value : null;
}
