// The dashboard's shell: login, the navigation and a hash router (#/sessions, #/sessions/<id>,
// #/templates, #/images, #/ops). Nothing of the token or of the API goes into the URL.
import "@xterm/xterm/css/xterm.css";
import "./style.css";
import { logout, setUnauthorizedHandler, token } from "./api";
import { clear, h } from "./dom";
import { imagesPage } from "./images";
import { loginPage } from "./login";
import { opsPage } from "./ops";
import { sessionPage } from "./session";
import { sessionsPage } from "./sessions";
import { templatesPage } from "./templates";

// What a page leaves running (sockets, streams) is stopped when another page is shown.
export type Cleanup = () => void;
let cleanup: Cleanup[] = [];

function nav(current: string): HTMLElement {
  const link = (href: string, text: string, key: string) =>
    h("a", { href, "aria-current": current === key ? "page" : undefined }, text);
  return h(
    "header",
    { class: "top" },
    h("a", { href: "#/sessions", class: "brand" }, "agentbox"),
    h(
      "nav",
      { "aria-label": "main" },
      link("#/sessions", "Sessions", "sessions"),
      link("#/templates", "Templates", "templates"),
      link("#/images", "Images", "images"),
      link("#/ops", "Operations", "ops"),
    ),
    h(
      "button",
      {
        class: "logout",
        onclick: () => {
          logout();
          location.hash = "#/login";
          route();
        },
      },
      "Log out",
    ),
  );
}

function route(): void {
  for (const c of cleanup) c();
  cleanup = [];
  const app = document.getElementById("app")!;
  clear(app);
  const hash = location.hash.replace(/^#/, "") || "/sessions";
  if (token() === null || hash === "/login") {
    app.appendChild(
      loginPage(() => {
        // A changed hash routes by itself (hashchange); the same hash needs a call.
        if (location.hash === "#/sessions") route();
        else location.hash = "#/sessions";
      }),
    );
    return;
  }
  const parts = hash.split("/").filter(Boolean).map(decodeURIComponent);
  const main = h("main", { id: "main" });
  const page = parts[0] || "sessions";
  app.append(nav(page === "sessions" && parts[1] ? "" : page), main);
  const onCleanup = (c: Cleanup) => cleanup.push(c);
  if (page === "sessions" && parts[1]) sessionPage(main, parts[1], onCleanup);
  else if (page === "templates") templatesPage(main, onCleanup);
  else if (page === "images") imagesPage(main, onCleanup);
  else if (page === "ops") opsPage(main, onCleanup);
  else sessionsPage(main, onCleanup);
}

setUnauthorizedHandler(() => {
  // The token stopped working (rotated, wrong): back to the login.
  logout();
  if (location.hash !== "#/login") location.hash = "#/login";
});

window.addEventListener("hashchange", route);
document.addEventListener("DOMContentLoaded", route);
