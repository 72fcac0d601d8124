// A renderer of a Helm chart's templates for the offline tests, because no Helm is packaged in
// Debian or npm. It implements the subset of Go templates and Helm functions that
// deploy/helm/agentbox uses, strictly: a missing value, an unknown function or an unclosed block
// is an error (like `helm lint --strict`), so a typo in the chart fails the test. It is not
// Helm: the chart must keep to this subset (the README says so), and real `helm template` is the
// reference wherever Helm is at hand.
//
// Supported: {{ }} with {{- -}} trimming, {{/* comments */}}, if / else if / else, with, range
// (over lists and maps; dot = the element), define / include / template, `$` and `.` paths
// (.Values, .Release, .Chart), "strings", numbers, true/false, ( ) sub-expressions, pipelines,
// and the functions: default, required, quote, squote, toYaml, indent, nindent, printf, eq, ne,
// not, and, or, empty, b64enc, trunc, trimSuffix, toString, int, list, join, lower.
//   node helm_render.mjs CHART_DIR [VALUES.yaml...]   prints the rendered manifests
import fs from "node:fs";
import path from "node:path";
import YAML from "yaml";

function tokenize(src, name) {
  const out = [];
  let i = 0;
  while (i < src.length) {
    const open = src.indexOf("{{", i);
    if (open < 0) {
      out.push({ text: src.slice(i) });
      break;
    }
    let text = src.slice(i, open);
    let start = open + 2;
    if (src[start] === "-" && /\s/.test(src[start + 1])) {
      text = text.replace(/\s+$/, "");
      start += 1;
    }
    const close = src.indexOf("}}", start);
    if (close < 0) throw new Error(`${name}: unclosed {{`);
    let end = close;
    let trimRight = false;
    if (src[close - 1] === "-" && /\s/.test(src[close - 2])) {
      end = close - 1;
      trimRight = true;
    }
    out.push({ text });
    out.push({ action: src.slice(start, end).trim() });
    i = close + 2;
    if (trimRight) while (i < src.length && /\s/.test(src[i])) i++;
  }
  return out.filter((t) => t.action !== undefined || t.text !== "");
}

// Blocks: {type:'text'|'expr'|'if'|'range'|'with'|'define', ...}.
function parse(tokens, name) {
  const root = { children: [] };
  const stack = [root];
  const top = () => stack[stack.length - 1];
  for (const t of tokens) {
    if (t.text !== undefined) {
      top().children.push({ type: "text", text: t.text });
      continue;
    }
    const a = t.action;
    if (a.startsWith("/*")) continue;
    const m = /^(if|range|with|define|else if|else|end)\b\s*(.*)$/s.exec(a);
    if (!m) {
      top().children.push({ type: "expr", expr: a });
      continue;
    }
    const [, kw, rest] = m;
    if (kw === "if" || kw === "range" || kw === "with" || kw === "define") {
      const node = { type: kw, expr: rest, branches: [{ cond: rest, children: [] }] };
      node.children = node.branches[0].children;
      top().children.push(node);
      stack.push(node);
    } else if (kw === "else if" || kw === "else") {
      const node = top();
      if (node === root || !["if", "with", "range"].includes(node.type)) {
        throw new Error(`${name}: {{${a}}} outside if/with/range`);
      }
      node.branches.push({ cond: kw === "else" ? null : rest, children: [] });
      node.children = node.branches[node.branches.length - 1].children;
    } else {
      if (stack.length === 1) throw new Error(`${name}: {{end}} without a block`);
      stack.pop();
    }
  }
  if (stack.length !== 1) throw new Error(`${name}: {{${top().type}}} not closed`);
  return root.children;
}

function lex(expr) {
  const toks = [];
  const re = /\s*("(?:[^"\\]|\\.)*"|`[^`]*`|\(|\)|\||-?\d+(?:\.\d+)?|[$.A-Za-z_][\w.$]*)/gy;
  let m;
  let pos = 0;
  while (pos < expr.length && (m = re.exec(expr))) {
    toks.push(m[1]);
    pos = re.lastIndex;
  }
  if (expr.slice(pos).trim() !== "") throw new Error(`cannot parse '${expr}' at '${expr.slice(pos)}'`);
  return toks;
}

const truthy = (v) =>
  !(v === undefined || v === null || v === false || v === 0 || v === "" ||
    (Array.isArray(v) && v.length === 0) ||
    (typeof v === "object" && !Array.isArray(v) && Object.keys(v).length === 0));

const toYaml = (v) => (v === undefined || v === null ? "null" : YAML.stringify(v).replace(/\n$/, ""));

export class Chart {
  constructor(dir, values) {
    this.dir = dir;
    this.meta = YAML.parse(fs.readFileSync(path.join(dir, "Chart.yaml"), "utf8"));
    this.values = values;
    this.defines = {};
    this.files = {};
    const tdir = path.join(dir, "templates");
    for (const f of fs.readdirSync(tdir).sort()) {
      if (!/\.(yaml|tpl)$/.test(f)) continue;
      const nodes = parse(tokenize(fs.readFileSync(path.join(tdir, f), "utf8"), f), f);
      for (const n of nodes) if (n.type === "define") this.defines[JSON.parse(n.expr)] = n.children;
      if (!f.startsWith("_")) this.files[f] = nodes;
    }
  }

  root(release) {
    return {
      Values: this.values,
      Release: { Name: release.name, Namespace: release.namespace, Service: "Helm" },
      Chart: { Name: this.meta.name, Version: this.meta.version, AppVersion: this.meta.appVersion },
    };
  }

  render(release = { name: "agentbox", namespace: "agentbox" }) {
    const root = this.root(release);
    let out = "";
    for (const [f, nodes] of Object.entries(this.files)) {
      const text = this.exec(nodes, root, root, f);
      if (text.trim() !== "") out += `---\n# Source: ${this.meta.name}/templates/${f}\n${text.trim()}\n`;
    }
    return out;
  }

  exec(nodes, dot, root, where) {
    let out = "";
    for (const n of nodes) {
      if (n.type === "text") out += n.text;
      else if (n.type === "define") continue;
      else if (n.type === "expr") {
        const v = this.evalPipe(n.expr, dot, root, where);
        out += v === undefined || v === null ? "" : String(v);
      } else if (n.type === "if") {
        for (const b of n.branches) {
          if (b.cond === null || truthy(this.evalPipe(b.cond, dot, root, where))) {
            out += this.exec(b.children, dot, root, where);
            break;
          }
        }
      } else if (n.type === "with") {
        const v = this.evalPipe(n.branches[0].cond, dot, root, where);
        if (truthy(v)) out += this.exec(n.branches[0].children, v, root, where);
        else if (n.branches[1]) out += this.exec(n.branches[1].children, dot, root, where);
      } else if (n.type === "range") {
        const v = this.evalPipe(n.branches[0].cond, dot, root, where);
        const items = Array.isArray(v) ? v : truthy(v) ? Object.values(v) : [];
        if (items.length === 0 && n.branches[1]) out += this.exec(n.branches[1].children, dot, root, where);
        for (const it of items) out += this.exec(n.branches[0].children, it, root, where);
      }
    }
    return out;
  }

  evalPipe(expr, dot, root, where) {
    const toks = lex(expr);
    let i = 0;
    const self = this;
    // A command: a function and its arguments, or one operand. `piped` is the previous result.
    function command(stop, piped, hasPiped) {
      const words = [];
      while (i < toks.length && toks[i] !== "|" && toks[i] !== stop) {
        if (toks[i] === "(") {
          i++;
          words.push({ value: pipeline(")") });
          if (toks[i] !== ")") throw new Error(`${where}: unclosed ( in '${expr}'`);
          i++;
        } else {
          words.push({ tok: toks[i++] });
        }
      }
      if (words.length === 0) throw new Error(`${where}: empty command in '${expr}'`);
      const first = words[0];
      if (first.tok && /^[A-Za-z_]\w*$/.test(first.tok) && !["true", "false", "nil"].includes(first.tok)) {
        const args = words.slice(1).map(operand);
        if (hasPiped) args.push(piped);
        return self.call(first.tok, args, dot, root, where);
      }
      if (words.length > 1 || hasPiped) throw new Error(`${where}: '${expr}': not a function`);
      return operand(first);
    }
    function operand(w) {
      if ("value" in w) return w.value;
      const t = w.tok;
      if (t.startsWith('"')) return JSON.parse(t);
      if (t.startsWith("`")) return t.slice(1, -1);
      if (/^-?\d/.test(t)) return Number(t);
      if (t === "true") return true;
      if (t === "false") return false;
      if (t === "nil") return null;
      if (t === "." ) return dot;
      if (t === "$") return root;
      let base = t.startsWith("$") ? root : dot;
      const parts = t.replace(/^\$/, "").split(".").filter((p) => p !== "");
      let walked = t.startsWith("$") ? "$" : "";
      for (const p of parts) {
        walked += "." + p;
        if (base === null || typeof base !== "object" || !(p in base)) {
          throw new Error(`${where}: '${walked}' is not set (in '${expr}')`);
        }
        base = base[p];
      }
      return base;
    }
    function pipeline(stop) {
      let v = command(stop, undefined, false);
      while (toks[i] === "|") {
        i++;
        v = command(stop, v, true);
      }
      return v;
    }
    const v = pipeline(undefined);
    if (i !== toks.length) throw new Error(`${where}: trailing '${toks.slice(i).join(" ")}' in '${expr}'`);
    return v;
  }

  call(fn, a, dot, root, where) {
    const need = (n) => {
      if (a.length !== n) throw new Error(`${where}: ${fn} takes ${n} arguments, got ${a.length}`);
    };
    switch (fn) {
      case "include":
      case "template": {
        need(2);
        const body = this.defines[a[0]];
        if (!body) throw new Error(`${where}: no template named "${a[0]}"`);
        return this.exec(body, a[1], root, `${where} -> ${a[0]}`);
      }
      case "default": need(2); return truthy(a[1]) ? a[1] : a[0];
      case "required":
        need(2);
        if (!truthy(a[1])) throw new Error(`${where}: required: ${a[0]}`);
        return a[1];
      case "quote": need(1); return JSON.stringify(a[0] === undefined || a[0] === null ? "" : String(a[0]));
      case "squote": need(1); return `'${String(a[0] ?? "")}'`;
      case "toYaml": need(1); return toYaml(a[0]);
      case "indent": need(2); return String(a[1]).split("\n").map((l) => " ".repeat(a[0]) + l).join("\n");
      case "nindent": need(2); return "\n" + String(a[1]).split("\n").map((l) => " ".repeat(a[0]) + l).join("\n");
      case "printf": {
        let k = 1;
        return String(a[0]).replace(/%[sdv]/g, () => String(a[k++]));
      }
      case "eq": need(2); return a[0] === a[1];
      case "ne": need(2); return a[0] !== a[1];
      case "not": need(1); return !truthy(a[0]);
      case "and": return a.every(truthy) ? a[a.length - 1] : a.find((x) => !truthy(x));
      case "or": return a.find(truthy) ?? a[a.length - 1];
      case "empty": need(1); return !truthy(a[0]);
      case "b64enc": need(1); return Buffer.from(String(a[0])).toString("base64");
      case "trunc": need(2); return String(a[1]).slice(0, a[0]);
      case "trimSuffix": need(2); return String(a[1]).endsWith(a[0]) ? String(a[1]).slice(0, -a[0].length) : String(a[1]);
      case "toString": need(1); return String(a[0]);
      case "int": need(1); return Math.trunc(Number(a[0]));
      case "list": return a;
      case "join": need(2); return a[1].join(a[0]);
      case "lower": need(1); return String(a[0]).toLowerCase();
      default: throw new Error(`${where}: unknown function '${fn}'`);
    }
  }
}

function merge(base, over) {
  if (over === null || typeof over !== "object" || Array.isArray(over)) return over;
  const out = { ...(base && typeof base === "object" && !Array.isArray(base) ? base : {}) };
  for (const [k, v] of Object.entries(over)) out[k] = merge(out[k], v);
  return out;
}

// The chart's values.yaml with each file's values merged over it (maps merged, the rest replaced).
export function loadValues(dir, files = []) {
  let v = YAML.parse(fs.readFileSync(path.join(dir, "values.yaml"), "utf8")) ?? {};
  for (const f of files) v = merge(v, YAML.parse(fs.readFileSync(f, "utf8")) ?? {});
  return v;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const [dir, ...files] = process.argv.slice(2);
  process.stdout.write(new Chart(dir, loadValues(dir, files)).render());
}
