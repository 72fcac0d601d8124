import { ApiError, request, setToken } from "./api";
import { h, status } from "./dom";

// The token is checked against GET /v1/sessions before it is kept (sessionStorage only).
export function loginPage(done: () => void): HTMLElement {
  const input = h("input", {
    type: "password",
    id: "token",
    name: "token",
    autocomplete: "current-password",
    "aria-label": "API token",
    class: "wide",
  });
  const st = status();
  const form = h(
    "form",
    { class: "login card" },
    h("h1", {}, "agentbox"),
    h("label", { for: "token" }, "API token"),
    input,
    h("button", { type: "submit", class: "primary" }, "Log in"),
    st.el,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    st.clear();
    try {
      await request("GET", "/v1/sessions", { token: input.value.trim() });
      setToken(input.value.trim());
      done();
    } catch (err) {
      st.error(err instanceof ApiError && err.status === 401 ? "Wrong token: " + err.message : err);
    }
  });
  setTimeout(() => input.focus(), 0);
  return h("div", { class: "center" }, form);
}
