// esbuild bundles the CSS files main.ts imports (app.css beside app.js).
declare module "*.css";
