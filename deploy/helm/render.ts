// Renders the chart in deploy/helm/sandfork the way `helm template` would, for the tests (helm
// itself is not installable here). It implements the part of Go's text/template and Helm's
// functions the chart uses, and refuses anything else, so that a template the renderer cannot
// read fails the test rather than rendering differently from Helm:
//   {{ pipeline }}, {{- and -}} trimming, {{/* comments */}}, if / else / end,
//   range $k, $v := (maps by sorted key, lists), define / include, fields of . $ and $var,
//   and the functions include, toYaml, nindent, indent, quote, not, eq, default, required.
// A field that does not exist is an error too (Helm would print nothing): a misspelt value
// name fails loudly.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { parse as parseYaml, stringify as stringifyYaml } from "yaml";

type Value = unknown;

interface Scope {
  dot: Value;
  root: Value;
  vars: Map<string, Value>;
}

type Node =
  | { kind: "text"; text: string }
  | { kind: "action"; pipeline: string }
  | { kind: "if"; cond: string; whenTrue: Node[]; otherwise: Node[] }
  | { kind: "range"; vars: string[]; pipeline: string; body: Node[] }
  | { kind: "define"; name: string; body: Node[] };

/** Text and actions, with `{{-` and `-}}` trimming applied to the text beside them. */
function lex(source: string, file: string): (string | { action: string })[] {
  const out: (string | { action: string })[] = [];
  let at = 0;
  let trimNext = false;
  while (at < source.length) {
    const open = source.indexOf("{{", at);
    let text = source.slice(at, open === -1 ? source.length : open);
    if (trimNext) text = text.replace(/^\s+/, "");
    if (open === -1) {
      out.push(text);
      break;
    }
    const close = source.indexOf("}}", open);
    if (close === -1) throw new Error(`${file}: an action is not closed`);
    let inner = source.slice(open + 2, close);
    if (inner.startsWith("- ") || inner.startsWith("-\n")) {
      text = text.replace(/\s+$/, "");
      inner = inner.slice(1);
    }
    trimNext = inner.endsWith(" -") || inner.endsWith("\n-");
    if (trimNext) inner = inner.slice(0, -1);
    out.push(text);
    inner = inner.trim();
    if (!(inner.startsWith("/*") && inner.endsWith("*/"))) out.push({ action: inner });
    at = close + 2;
  }
  return out;
}

function parse(source: string, file: string): Node[] {
  const tokens = lex(source, file);
  let at = 0;
  const block = (ends: string[]): { nodes: Node[]; end: string } => {
    const nodes: Node[] = [];
    while (at < tokens.length) {
      const token = tokens[at++] as string | { action: string };
      if (typeof token === "string") {
        if (token !== "") nodes.push({ kind: "text", text: token });
        continue;
      }
      const action = token.action;
      const word = action.split(/\s+/)[0] as string;
      if (ends.includes(word)) return { nodes, end: word };
      if (word === "if") {
        const whenTrue = block(["else", "end"]);
        const otherwise = whenTrue.end === "else" ? block(["end"]).nodes : [];
        nodes.push({
          kind: "if",
          cond: action.slice(2).trim(),
          whenTrue: whenTrue.nodes,
          otherwise,
        });
      } else if (word === "range") {
        const match = /^range\s+(?:(\$\w+)\s*(?:,\s*(\$\w+))?\s*:=\s*)?(.+)$/.exec(action);
        if (match === null) throw new Error(`${file}: cannot read "${action}"`);
        const vars = [match[1], match[2]].filter((v): v is string => v !== undefined);
        nodes.push({
          kind: "range",
          vars,
          pipeline: match[3] as string,
          body: block(["end"]).nodes,
        });
      } else if (word === "define") {
        const name = JSON.parse(action.slice(6).trim()) as string;
        nodes.push({ kind: "define", name, body: block(["end"]).nodes });
      } else if (["else", "end", "with", "template", "block"].includes(word)) {
        throw new Error(`${file}: "${action}" is not supported here`);
      } else {
        nodes.push({ kind: "action", pipeline: action });
      }
    }
    if (ends.length > 0) throw new Error(`${file}: missing {{ end }}`);
    return { nodes, end: "" };
  };
  return block([]).nodes;
}

/** Tokens of a pipeline: strings, numbers, words, fields, variables, | ( ). */
function tokenize(pipeline: string): string[] {
  const tokens: string[] = [];
  const pattern = /\s*("(?:[^"\\]|\\.)*"|[|()]|[^\s|()]+)/gy;
  let match: RegExpExecArray | null = pattern.exec(pipeline);
  while (match !== null && match[1] !== undefined) {
    tokens.push(match[1]);
    match = pattern.exec(pipeline);
  }
  if (tokens.join("").replace(/\s/g, "") !== pipeline.replace(/\s/g, ""))
    throw new Error(`cannot read the pipeline "${pipeline}"`);
  return tokens;
}

function truthy(value: Value): boolean {
  if (value === null || value === undefined || value === false || value === 0 || value === "")
    return false;
  if (Array.isArray(value)) return value.length > 0;
  if (typeof value === "object") return Object.keys(value as object).length > 0;
  return true;
}

function field(base: Value, path: string[], whole: string): Value {
  let value = base;
  for (const name of path) {
    if (typeof value !== "object" || value === null || !(name in (value as object)))
      throw new Error(`${whole}: no field "${name}"`);
    value = (value as Record<string, Value>)[name];
  }
  return value;
}

function printed(value: Value): string {
  if (value === null || value === undefined) throw new Error("printing a missing value");
  if (typeof value === "object")
    throw new Error(`printing a map or list (${JSON.stringify(value)}): use toYaml`);
  return String(value);
}

function indentLines(spaces: number, text: string): string {
  const pad = " ".repeat(spaces);
  return text
    .split("\n")
    .map((line) => pad + line)
    .join("\n");
}

export interface ChartRelease {
  name: string;
  namespace: string;
}

export class ChartRenderer {
  private readonly defines = new Map<string, Node[]>();
  private readonly templates = new Map<string, Node[]>();
  private readonly chart: Record<string, Value>;

  constructor(private readonly chartDir: string) {
    this.chart = parseYaml(readFileSync(join(chartDir, "Chart.yaml"), "utf8")) as Record<
      string,
      Value
    >;
    const dir = join(chartDir, "templates");
    for (const file of readdirSync(dir).sort()) {
      const nodes = parse(readFileSync(join(dir, file), "utf8"), file);
      for (const node of nodes) if (node.kind === "define") this.defines.set(node.name, node.body);
      if (file.endsWith(".yaml")) this.templates.set(file, nodes);
    }
  }

  /** The chart's values.yaml with `overrides` merged over it (maps merged, the rest replaced). */
  values(overrides: Record<string, Value> = {}): Record<string, Value> {
    const base = parseYaml(readFileSync(join(this.chartDir, "values.yaml"), "utf8")) as Record<
      string,
      Value
    >;
    const merge = (into: Record<string, Value>, from: Record<string, Value>) => {
      for (const [key, value] of Object.entries(from)) {
        const current = into[key];
        if (
          typeof value === "object" &&
          value !== null &&
          !Array.isArray(value) &&
          typeof current === "object" &&
          current !== null &&
          !Array.isArray(current)
        )
          merge(current as Record<string, Value>, value as Record<string, Value>);
        else into[key] = value;
      }
    };
    merge(base, overrides);
    return base;
  }

  /** Every template rendered, by file name (helm template's output, one file at a time). */
  render(release: ChartRelease, overrides: Record<string, Value> = {}): Map<string, string> {
    const root = {
      Values: this.values(overrides),
      Release: { Name: release.name, Namespace: release.namespace, Service: "Helm" },
      Chart: {
        Name: this.chart.name,
        Version: this.chart.version,
        AppVersion: this.chart.appVersion,
      },
    };
    const out = new Map<string, string>();
    for (const [file, nodes] of this.templates) {
      try {
        out.set(file, this.run(nodes, { dot: root, root, vars: new Map() }));
      } catch (error) {
        throw new Error(`${file}: ${(error as Error).message}`);
      }
    }
    return out;
  }

  /** Every object the rendered templates hold, parsed (empty documents left out). */
  objects(
    release: ChartRelease,
    overrides: Record<string, Value> = {},
  ): { file: string; object: Record<string, Value> }[] {
    const objects: { file: string; object: Record<string, Value> }[] = [];
    for (const [file, text] of this.render(release, overrides))
      for (const document of text.split(/^---\s*$/m)) {
        const object = parseYaml(document) as Record<string, Value> | null;
        if (object !== null) objects.push({ file, object });
      }
    return objects;
  }

  private run(nodes: Node[], scope: Scope): string {
    let out = "";
    for (const node of nodes) {
      if (node.kind === "text") out += node.text;
      else if (node.kind === "action") out += printed(this.pipeline(node.pipeline, scope));
      else if (node.kind === "if")
        out += this.run(
          truthy(this.pipeline(node.cond, scope)) ? node.whenTrue : node.otherwise,
          scope,
        );
      else if (node.kind === "range") out += this.range(node, scope);
    }
    return out;
  }

  private range(node: Extract<Node, { kind: "range" }>, scope: Scope): string {
    const over = this.pipeline(node.pipeline, scope);
    const entries: [Value, Value][] = Array.isArray(over)
      ? over.map((v, i) => [i, v])
      : typeof over === "object" && over !== null
        ? Object.keys(over)
            .sort()
            .map((k) => [k, (over as Record<string, Value>)[k]])
        : [];
    let out = "";
    for (const [key, value] of entries) {
      const vars = new Map(scope.vars);
      if (node.vars.length === 1) vars.set(node.vars[0] as string, value);
      if (node.vars.length === 2) {
        vars.set(node.vars[0] as string, key);
        vars.set(node.vars[1] as string, value);
      }
      out += this.run(node.body, { ...scope, dot: value, vars });
    }
    return out;
  }

  private pipeline(text: string, scope: Scope): Value {
    const tokens = tokenize(text);
    let at = 0;
    const pipe = (): Value => {
      let value = command(undefined, false);
      while (tokens[at] === "|") {
        at++;
        value = command(value, true);
      }
      return value;
    };
    const operand = (): Value => {
      const token = tokens[at++];
      if (token === undefined) throw new Error(`"${text}" ends early`);
      if (token === "(") {
        const value = pipe();
        if (tokens[at++] !== ")") throw new Error(`"${text}": missing )`);
        return value;
      }
      if (token.startsWith('"')) return JSON.parse(token) as string;
      if (/^-?\d+$/.test(token)) return Number(token);
      if (token === "true" || token === "false") return token === "true";
      if (token === ".") return scope.dot;
      if (token.startsWith(".")) return field(scope.dot, token.slice(1).split("."), token);
      if (token.startsWith("$")) {
        const [name, ...path] = token.split(".");
        const base = name === "$" ? scope.root : scope.vars.get(name as string);
        if (base === undefined) throw new Error(`no variable ${name}`);
        return field(base, path, token);
      }
      throw new Error(`"${text}": unexpected ${token}`);
    };
    const command = (piped: Value, hasPiped: boolean): Value => {
      const head = tokens[at];
      if (head !== undefined && /^[a-zA-Z]\w*$/.test(head) && head !== "true" && head !== "false") {
        at++;
        const args: Value[] = [];
        while (at < tokens.length && tokens[at] !== "|" && tokens[at] !== ")") args.push(operand());
        if (hasPiped) args.push(piped);
        return this.call(head, args);
      }
      if (hasPiped) throw new Error(`"${text}": only a function can follow |`);
      return operand();
    };
    const value = pipe();
    if (at !== tokens.length) throw new Error(`"${text}": unexpected ${tokens[at]}`);
    return value;
  }

  private call(name: string, args: Value[]): Value {
    const arity = (n: number) => {
      if (args.length !== n) throw new Error(`${name} takes ${n} argument(s), got ${args.length}`);
    };
    switch (name) {
      case "include": {
        arity(2);
        const body = this.defines.get(args[0] as string);
        if (body === undefined) throw new Error(`no template "${String(args[0])}" defined`);
        return this.run(body, { dot: args[1], root: args[1], vars: new Map() });
      }
      case "toYaml":
        arity(1);
        return stringifyYaml(args[0]).replace(/\n$/, "");
      case "nindent":
        arity(2);
        return `\n${indentLines(args[0] as number, String(args[1]))}`;
      case "indent":
        arity(2);
        return indentLines(args[0] as number, String(args[1]));
      case "quote":
        arity(1);
        return JSON.stringify(printed(args[0]));
      case "not":
        arity(1);
        return !truthy(args[0]);
      case "eq":
        arity(2);
        return args[0] === args[1];
      case "default":
        arity(2);
        return truthy(args[1]) ? args[1] : args[0];
      case "required":
        arity(2);
        if (!truthy(args[1])) throw new Error(String(args[0]));
        return args[1];
      default:
        throw new Error(`the function ${name} is not supported here`);
    }
  }
}
