// The Sandfork web console: sign in with an API key (traded for a token kept in memory), then the
// playground, sessions, keys and usage pages, routed by the URL's hash.
import {
  ApiError,
  api,
  can,
  getSessionFile,
  putSessionFile,
  session,
  signIn,
  signOut,
  streamExecution,
  whenSignedOut,
} from "./api.js";
import { type Point, usageChart } from "./chart.js";
import { field, h, when } from "./dom.js";
import { createEditor } from "./editor.js";

interface Template {
  name: string;
  language: string;
  languages: string[];
  ready: boolean;
  price: { unit: string; base_units: number; units_per_second: number };
}
interface Execution {
  id: string;
  template: string;
  status: string;
  exit_code: number | null;
  stdout?: string | null;
  stderr?: string | null;
  timings: { queue_ms: number; fork_ms: number; exec_ms: number; total_ms: number } | null;
  usage: { unit: string; reserved_units: number; units: number | null };
  created_at: string;
  finished_at: string | null;
}
interface SessionInfo {
  id: string;
  template: string;
  state: string;
  cells: number;
  last_checkpoint: { checkpoint: number } | null;
  usage: { units: number; unit: string };
  created_at: string;
  last_active_at: string;
}
interface Key {
  id: string;
  name: string;
  hint: string;
  scopes: string[];
  created_at: string;
  revoked_at: string | null;
  expires_at: string | null;
}

const main = document.getElementById("main") as HTMLElement;
const nav = document.getElementById("nav") as HTMLElement;
const who = document.getElementById("who") as HTMLElement;
const whoText = document.getElementById("who-text") as HTMLElement;
const toast = document.getElementById("toast") as HTMLElement;

const SAMPLES: Record<string, string> = {
  python:
    'import time\nfor i in range(3):\n    print("tick", i, flush=True)\n    time.sleep(0.2)\nprint(6 * 7)\n',
  javascript: "for (let i = 0; i < 3; i++) console.log('tick', i);\nconsole.log(6 * 7);\n",
  // biome-ignore lint/suspicious/noTemplateCurlyInString: a TypeScript sample, its template literal meant
  typescript: "const answer: number = 6 * 7;\nconsole.log(`answer: ${answer}`);\n",
};

let templatesCache: Template[] | null = null;
async function templates(): Promise<Template[]> {
  templatesCache ??= (await api<{ templates: Template[] }>("GET", "/v1/templates")).templates;
  return templatesCache;
}

const ms = (n: number) => `${n < 10 ? n.toFixed(2) : Math.round(n)} ms`;

function say(message: string): void {
  toast.textContent = message;
  toast.hidden = false;
  window.setTimeout(() => (toast.hidden = true), 2500);
}

function errorText(error: unknown): string {
  if (error instanceof ApiError) {
    // A validation failure says where: "files.0.path: absolute paths are not allowed".
    const issues = (error.problem.errors ?? []).map((e) => `${e.path}: ${e.message}`);
    return `${error.problem.title ?? "Error"} (${error.status}): ${[error.message, ...issues].join("; ")}`;
  }
  return error instanceof Error ? error.message : String(error);
}

function alertBox(): HTMLElement {
  return h("p", { class: "error", role: "alert", hidden: true });
}
function showError(box: HTMLElement, error: unknown): void {
  box.textContent = errorText(error);
  box.hidden = false;
}

function page(title: string, ...content: (Node | null)[]): void {
  main.replaceChildren(h("h1", {}, title), ...content.filter((c): c is Node => c !== null));
  document.title = `${title} · Sandfork console`;
}

// ---- sign in -------------------------------------------------------------------------------

function signInPage(reason = ""): void {
  nav.hidden = true;
  who.hidden = true;
  const key = h("input", {
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
    placeholder: "sfk_…",
  });
  const error = alertBox();
  if (reason !== "") showError(error, reason);
  const form = h(
    "form",
    { class: "card narrow" },
    h(
      "p",
      {},
      "Paste an API key. The console trades it for a token that lasts an hour and is kept only in this tab's memory; the key itself is not kept.",
    ),
    field("API key", key),
    error,
    h("button", { type: "submit" }, "Sign in"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.hidden = true;
    try {
      await signIn(key.value.trim());
      key.value = "";
      if (location.hash === "" || location.hash === "#/") location.hash = "#/playground";
      route();
    } catch (e) {
      showError(error, e);
    }
  });
  page("Sign in", form);
  key.focus();
}

whenSignedOut((reason) => {
  templatesCache = null;
  signInPage(reason);
});

// ---- playground ----------------------------------------------------------------------------

async function playgroundPage(): Promise<void> {
  const error = alertBox();
  const templateSelect = h("select", {});
  const languageSelect = h("select", {});
  const stdin = h("textarea", { rows: 2, spellcheck: "false" });
  const timeout = h("input", {
    type: "number",
    min: 1,
    max: 30000,
    step: 100,
    value: 5000,
    inputmode: "numeric",
  });
  const run = h("button", { type: "button" }, "Run");
  const status = h(
    "p",
    { class: "status", role: "status", "aria-live": "polite", "data-testid": "run-status" },
    "Not run yet",
  );
  const output = h("pre", {
    class: "output",
    role: "log",
    tabindex: 0,
    "aria-label": "Output",
    "data-testid": "output",
  });
  const facts = h("dl", { class: "facts" });
  const editorHost = h("div", { class: "editor" });
  const files = inputFiles();
  page(
    "Playground",
    h(
      "div",
      { class: "toolbar" },
      field("Template", templateSelect),
      field("Language", languageSelect),
      field("Timeout (ms)", timeout),
      h("div", { class: "field run" }, run, h("small", {}, "Ctrl+Enter in the editor")),
    ),
    error,
    h(
      "div",
      { class: "field" },
      h("span", { class: "label", id: "code-label" }, "Code"),
      editorHost,
    ),
    field("Standard input", stdin),
    files.element,
    h(
      "section",
      { "aria-labelledby": "result-heading", class: "result" },
      h("h2", { id: "result-heading" }, "Result"),
      status,
      output,
      facts,
    ),
  );
  const editor = createEditor(
    editorHost,
    "Code",
    SAMPLES.python ?? "",
    "python",
    () => void execute(),
  );

  let list: Template[] = [];
  try {
    list = await templates();
  } catch (e) {
    showError(error, e);
  }
  templateSelect.replaceChildren(
    ...list.map((t) => h("option", { value: t.name }, `${t.name}${t.ready ? "" : " (not ready)"}`)),
  );
  const fillLanguages = () => {
    const template = list.find((t) => t.name === templateSelect.value);
    languageSelect.replaceChildren(
      ...(template?.languages ?? []).map((l) => h("option", { value: l }, l)),
    );
    const language = languageSelect.value;
    editor.setLanguage(language);
    editor.code = SAMPLES[language] ?? "";
  };
  templateSelect.addEventListener("change", fillLanguages);
  languageSelect.addEventListener("change", () => {
    editor.setLanguage(languageSelect.value);
    editor.code = SAMPLES[languageSelect.value] ?? editor.code;
  });
  const python = list.find((t) => t.name === "python");
  if (python !== undefined) templateSelect.value = python.name;
  fillLanguages();

  let running = false;
  async function execute(): Promise<void> {
    if (running) return;
    running = true;
    run.disabled = true;
    error.hidden = true;
    output.replaceChildren();
    facts.replaceChildren();
    status.textContent = "Starting…";
    const template = list.find((t) => t.name === templateSelect.value);
    const request: Record<string, unknown> = {
      template: templateSelect.value,
      code: editor.code,
      timeout_ms: Number(timeout.value) || 5000,
    };
    if (template !== undefined && template.languages.length > 1)
      request.language = languageSelect.value;
    if (stdin.value !== "") request.stdin = stdin.value;
    if (files.value().length > 0) request.files = files.value();
    try {
      const record = await streamExecution<Execution>(request, {
        started: (id) => (status.textContent = `Running ${id}…`),
        output: (stream, data) =>
          output.append(stream === "stderr" ? h("span", { class: "stderr" }, data) : data),
      });
      // The record holds the whole output: shown as it ended, in case the stream left any out.
      output.replaceChildren(
        record.stdout ?? "",
        record.stderr ? h("span", { class: "stderr" }, record.stderr) : "",
      );
      status.textContent = `${record.status}${record.exit_code === null ? "" : ` (exit code ${record.exit_code})`}`;
      status.className = `status ${record.status === "completed" && record.exit_code === 0 ? "ok" : "bad"}`;
      const t = record.timings;
      const rows: [string, string][] = [
        ["Execution", record.id],
        ["Total", t === null ? "—" : ms(t.total_ms)],
        [
          "Queue / fork / run",
          t === null ? "—" : `${ms(t.queue_ms)} / ${ms(t.fork_ms)} / ${ms(t.exec_ms)}`,
        ],
        [
          "Charged",
          `${record.usage.units ?? 0} ${record.usage.unit}s (held ${record.usage.reserved_units})`,
        ],
      ];
      facts.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
    } catch (e) {
      status.textContent = "Failed";
      status.className = "status bad";
      showError(error, e);
    } finally {
      running = false;
      run.disabled = false;
    }
  }
  run.addEventListener("click", () => void execute());
}

/** The playground's input files: rows of a path under /work and its text, added and removed. */
function inputFiles(): {
  element: HTMLElement;
  value(): { path: string; content: string; encoding: "utf8" }[];
} {
  const rows: { row: HTMLElement; path: HTMLInputElement; content: HTMLTextAreaElement }[] = [];
  const list = h("div", { class: "file-rows" });
  const add = h("button", { type: "button", class: "secondary" }, "Add file");
  const renumber = () =>
    rows.forEach((r, i) => {
      r.row.setAttribute("aria-label", `File ${i + 1}`);
      r.row.querySelector("button")?.setAttribute("aria-label", `Remove file ${i + 1}`);
    });
  add.addEventListener("click", () => {
    const path = h("input", {
      type: "text",
      spellcheck: "false",
      autocomplete: "off",
      placeholder: "data.txt",
    });
    const content = h("textarea", { rows: 2, spellcheck: "false" });
    const remove = h("button", { type: "button", class: "danger" }, "Remove");
    const row = h(
      "div",
      { class: "file-row", role: "group" },
      field("Path", path),
      field("Content", content),
      h("div", { class: "field" }, remove),
    );
    const entry = { row, path, content };
    remove.addEventListener("click", () => {
      rows.splice(rows.indexOf(entry), 1);
      row.remove();
      renumber();
      add.focus();
    });
    rows.push(entry);
    list.append(row);
    renumber();
    path.focus();
  });
  const element = h(
    "fieldset",
    { class: "files" },
    h("legend", {}, "Files"),
    h("small", {}, "Placed under /work before the code runs, e.g. data.txt at /work/data.txt."),
    list,
    add,
  );
  return {
    element,
    value: () =>
      rows.map((r) => ({ path: r.path.value, content: r.content.value, encoding: "utf8" })),
  };
}

// ---- sessions ------------------------------------------------------------------------------

async function sessionsPage(): Promise<void> {
  const error = alertBox();
  const templateSelect = h("select", {});
  const create = h("button", { type: "submit" }, "Create session");
  const tableBody = h("tbody", {});
  const detail = h("section", { class: "card", "aria-live": "polite", hidden: true });
  page(
    "Sessions",
    h(
      "p",
      {},
      "A session keeps its state between cells; pause it to stop paying for its VM, fork it from a checkpoint.",
    ),
    h(
      "form",
      {
        class: "toolbar",
        onsubmit: (e: Event) => {
          e.preventDefault();
          void createSession();
        },
      },
      field("Template", templateSelect),
      h("div", { class: "field run" }, create),
    ),
    error,
    h(
      "div",
      { class: "table-wrap", tabindex: 0, role: "region", "aria-label": "Scrollable table" },
      h(
        "table",
        {},
        h("caption", {}, "Sessions of this sign-in"),
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            ...["Session", "Template", "State", "Cells", "Units", "Last active", "Actions"].map(
              (c) => h("th", { scope: "col" }, c),
            ),
          ),
        ),
        tableBody,
      ),
    ),
    detail,
  );
  try {
    templateSelect.replaceChildren(
      ...(await templates()).map((t) => h("option", { value: t.name }, t.name)),
    );
    templateSelect.value = "python";
  } catch (e) {
    showError(error, e);
  }

  async function refresh(): Promise<void> {
    const { sessions } = await api<{ sessions: SessionInfo[] }>("GET", "/v1/sessions");
    tableBody.replaceChildren(
      ...sessions.map((s) =>
        h(
          "tr",
          {},
          h("td", {}, h("code", {}, s.id.slice(0, 8))),
          h("td", {}, s.template),
          h("td", {}, h("span", { class: `badge ${s.state}` }, s.state)),
          h("td", { class: "num" }, s.cells),
          h("td", { class: "num" }, s.usage.units),
          h("td", {}, when(s.last_active_at)),
          h(
            "td",
            { class: "actions" },
            h(
              "button",
              {
                type: "button",
                class: "secondary",
                "aria-label": `Open session ${s.id.slice(0, 8)}`,
                onclick: () => open(s),
              },
              "Open",
            ),
            s.state === "running"
              ? h(
                  "button",
                  { type: "button", class: "secondary", onclick: () => act(s, "pause") },
                  "Pause",
                )
              : null,
            s.state === "paused"
              ? h(
                  "button",
                  { type: "button", class: "secondary", onclick: () => act(s, "resume") },
                  "Resume",
                )
              : null,
            s.last_checkpoint !== null
              ? h(
                  "button",
                  { type: "button", class: "secondary", onclick: () => act(s, "fork") },
                  "Fork",
                )
              : null,
            h(
              "button",
              { type: "button", class: "danger", onclick: () => act(s, "delete") },
              "Delete",
            ),
          ),
        ),
      ),
    );
    if (sessions.length === 0)
      tableBody.append(h("tr", {}, h("td", { colspan: 7 }, "No sessions yet.")));
  }

  async function createSession(): Promise<void> {
    error.hidden = true;
    create.disabled = true;
    try {
      const s = await api<SessionInfo>("POST", "/v1/sessions", { template: templateSelect.value });
      say(`Session ${s.id.slice(0, 8)} created`);
      await refresh();
      open(s);
    } catch (e) {
      showError(error, e);
    } finally {
      create.disabled = false;
    }
  }

  async function act(
    s: SessionInfo,
    action: "pause" | "resume" | "fork" | "delete",
  ): Promise<void> {
    error.hidden = true;
    try {
      if (action === "delete") {
        if (!window.confirm(`Delete session ${s.id.slice(0, 8)}?`)) return;
        await api("DELETE", `/v1/sessions/${s.id}`);
        if (detail.dataset.session === s.id) detail.hidden = true;
      } else if (action === "fork") {
        const forked = await api<SessionInfo>("POST", `/v1/sessions/${s.id}/fork`, {});
        say(`Forked into ${forked.id.slice(0, 8)}`);
      } else {
        await api("POST", `/v1/sessions/${s.id}/${action}`);
      }
      say(`Session ${s.id.slice(0, 8)}: ${action} done`);
      await refresh();
    } catch (e) {
      showError(error, e);
    }
  }

  function open(s: SessionInfo): void {
    detail.hidden = false;
    detail.dataset.session = s.id;
    const cell = h("textarea", { rows: 3, spellcheck: "false", class: "mono" }, "x = 6 * 7\nx");
    const cells = h("ol", { class: "cells", "data-testid": "cells" });
    const cellError = alertBox();
    const runCell = h("button", { type: "submit" }, "Run cell");
    const form = h(
      "form",
      {},
      field(
        "Cell",
        cell,
        "The last expression's value is shown, as in a notebook. Ctrl+Enter runs it.",
      ),
      cellError,
      runCell,
    );
    cell.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        form.requestSubmit();
      }
    });
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      cellError.hidden = true;
      runCell.disabled = true;
      try {
        const result = await api<{
          value: string | null;
          error: { name: string; message: string } | null;
          execution: Execution;
        }>("POST", `/v1/sessions/${s.id}/executions`, { code: cell.value });
        cells.append(
          h(
            "li",
            {},
            h("pre", { class: "mono in" }, cell.value),
            result.execution.stdout
              ? h("pre", { class: "mono out" }, result.execution.stdout)
              : null,
            result.execution.stderr
              ? h("pre", { class: "mono out stderr" }, result.execution.stderr)
              : null,
            result.value !== null
              ? h("pre", { class: "mono value", "data-testid": "cell-value" }, `→ ${result.value}`)
              : null,
            result.error !== null
              ? h("p", { class: "error" }, `${result.error.name}: ${result.error.message}`)
              : null,
          ),
        );
        cell.value = "";
        await refresh();
      } catch (err) {
        showError(cellError, err);
      } finally {
        runCell.disabled = false;
        cell.focus();
      }
    });
    detail.replaceChildren(
      h("h2", {}, `Session ${s.id.slice(0, 8)} (${s.template})`),
      cells,
      form,
      sessionFiles(s),
    );
    cell.focus();
  }

  try {
    await refresh();
  } catch (e) {
    showError(error, e);
  }
}

/** Saves bytes as a download named after the path's last component. */
function download(blob: Blob, path: string): void {
  const url = URL.createObjectURL(blob);
  const link = h("a", { href: url, download: path.split("/").pop() ?? "file" });
  document.body.append(link);
  link.click();
  link.remove();
  window.setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/**
 * A session's files under /work, by path: upload pasted text or a file from this device, and
 * download. The API has no route that lists a session's files, so the list is those written here.
 */
function sessionFiles(s: SessionInfo): HTMLElement {
  const path = h("input", {
    type: "text",
    spellcheck: "false",
    autocomplete: "off",
    placeholder: "data.txt",
    required: true,
  });
  const content = h("textarea", { rows: 3, spellcheck: "false", class: "mono" });
  const picker = h("input", { type: "file" });
  const upload = h("button", { type: "submit" }, "Upload");
  const fetchButton = h("button", { type: "button", class: "secondary" }, "Download");
  const fileError = alertBox();
  const written = h("ul", { class: "written", "data-testid": "session-files" });
  const paths = new Map<string, number>();
  const showWritten = () =>
    written.replaceChildren(
      ...[...paths].map(([p, bytes]) =>
        h(
          "li",
          {},
          h("code", {}, p),
          ` ${bytes} bytes `,
          h(
            "button",
            {
              type: "button",
              class: "secondary",
              "aria-label": `Download ${p}`,
              onclick: () => void get(p),
            },
            "Download",
          ),
        ),
      ),
    );
  async function get(p: string): Promise<void> {
    fileError.hidden = true;
    try {
      download(await getSessionFile(s.id, p), p);
    } catch (e) {
      showError(fileError, e);
    }
  }
  picker.addEventListener("change", () => {
    const chosen = picker.files?.[0];
    if (chosen !== undefined && path.value === "") path.value = chosen.name;
  });
  fetchButton.addEventListener("click", () => {
    if (path.reportValidity()) void get(path.value);
  });
  const form = h(
    "form",
    { class: "card files" },
    h("h3", {}, "Files in /work"),
    h(
      "p",
      {},
      "Upload text or a file from this device to a path, or download one by its path. The API has no route that lists a session's files; those uploaded here are listed below.",
    ),
    field("File path", path, "Relative to /work"),
    field("File content", content, "Uploaded as UTF-8 text unless a file is chosen below"),
    field("Or choose a file", picker),
    fileError,
    h("div", { class: "actions" }, upload, fetchButton),
    written,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    fileError.hidden = true;
    upload.disabled = true;
    try {
      const result = await putSessionFile(s.id, path.value, picker.files?.[0] ?? content.value);
      paths.set(result.path, result.bytes);
      showWritten();
      say(`Wrote ${result.bytes} bytes to /work/${result.path}`);
      picker.value = "";
    } catch (err) {
      showError(fileError, err);
    } finally {
      upload.disabled = false;
    }
  });
  return form;
}

// ---- keys ----------------------------------------------------------------------------------

async function keysPage(): Promise<void> {
  if (!can("admin")) {
    page(
      "Keys",
      h("p", {}, "Managing keys needs an admin key. Sign in with one to create and revoke keys."),
    );
    return;
  }
  const error = alertBox();
  const tableBody = h("tbody", {});
  const secretBox = h("div", { class: "card secret", hidden: true, "aria-live": "polite" });
  const name = h("input", { type: "text", required: true, maxlength: 200, autocomplete: "off" });
  const credits = h("input", {
    type: "number",
    min: 0,
    step: 1,
    value: 1000,
    inputmode: "numeric",
  });
  const rate = h("input", {
    type: "number",
    min: 1,
    step: 1,
    placeholder: "default",
    inputmode: "numeric",
  });
  const concurrency = h("input", {
    type: "number",
    min: 1,
    step: 1,
    placeholder: "default",
    inputmode: "numeric",
  });
  const expires = h("input", {
    type: "number",
    min: 1,
    step: 1,
    placeholder: "never",
    inputmode: "numeric",
  });
  const scopeBoxes = ["execute", "usage:read", "admin"].map((scope) => {
    const box = h("input", {
      type: "checkbox",
      value: scope,
      id: `scope-${scope.replace(":", "-")}`,
      checked: scope !== "admin",
    });
    return { scope, box, label: h("label", { class: "check", for: box.id }, box, ` ${scope}`) };
  });
  const form = h(
    "form",
    { class: "card" },
    h("h2", {}, "Create a key"),
    h(
      "div",
      { class: "grid" },
      field("Name", name),
      h("fieldset", {}, h("legend", {}, "Scopes"), ...scopeBoxes.map((s) => s.label)),
      field("Credits", credits, "Granted to the new key's own account"),
      field("Requests per minute", rate),
      field("Executions in flight", concurrency),
      field("Expires in (seconds)", expires),
    ),
    h("button", { type: "submit" }, "Create key"),
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    error.hidden = true;
    const scopes = scopeBoxes.filter((s) => s.box.checked).map((s) => s.scope);
    const body: Record<string, unknown> = { name: name.value.trim(), scopes };
    const number = (input: HTMLInputElement) =>
      input.value === "" ? undefined : Number(input.value);
    if (number(credits)) body.credits = number(credits);
    if (number(rate) !== undefined) body.rate_limit_per_minute = number(rate);
    if (number(concurrency) !== undefined) body.max_concurrency = number(concurrency);
    if (number(expires) !== undefined) body.expires_in_seconds = number(expires);
    try {
      const created = await api<Key & { key: string }>("POST", "/v1/keys", body);
      const secret = h("code", { class: "mono", "data-testid": "new-secret" }, created.key);
      const copy = h("button", { type: "button", class: "secondary" }, "Copy");
      copy.addEventListener("click", async () => {
        try {
          await navigator.clipboard.writeText(created.key);
          say("Copied to the clipboard");
        } catch {
          const range = document.createRange();
          range.selectNodeContents(secret);
          getSelection()?.removeAllRanges();
          getSelection()?.addRange(range);
          say("Selected: copy it with Ctrl+C");
        }
      });
      secretBox.replaceChildren(
        h("h2", {}, `Key “${created.name}” created`),
        h("p", {}, "Its secret is shown this once: copy it now."),
        h("div", { class: "secret-row" }, secret, copy),
      );
      secretBox.hidden = false;
      copy.focus();
      name.value = "";
      await refresh();
    } catch (err) {
      showError(error, err);
    }
  });
  page(
    "Keys",
    error,
    secretBox,
    form,
    h(
      "div",
      { class: "table-wrap", tabindex: 0, role: "region", "aria-label": "Scrollable table" },
      h(
        "table",
        {},
        h("caption", {}, "API keys"),
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            ...["Name", "Hint", "Scopes", "Created", "State", "Actions"].map((c) =>
              h("th", { scope: "col" }, c),
            ),
          ),
        ),
        tableBody,
      ),
    ),
  );

  async function refresh(): Promise<void> {
    const { keys } = await api<{ keys: Key[] }>("GET", "/v1/keys");
    tableBody.replaceChildren(
      ...keys.map((k) =>
        h(
          "tr",
          { "data-key": k.id },
          h("td", {}, k.name),
          h("td", {}, h("code", {}, k.hint)),
          h("td", {}, k.scopes.join(", ")),
          h("td", {}, when(k.created_at)),
          h(
            "td",
            {},
            k.revoked_at === null
              ? h("span", { class: "badge running" }, "active")
              : h("span", { class: "badge ended" }, "revoked"),
          ),
          h(
            "td",
            { class: "actions" },
            k.revoked_at === null
              ? h(
                  "button",
                  {
                    type: "button",
                    class: "danger",
                    "aria-label": `Revoke ${k.name}`,
                    onclick: async () => {
                      if (
                        !window.confirm(`Revoke the key “${k.name}”? Calls with it fail at once.`)
                      )
                        return;
                      try {
                        await api("DELETE", `/v1/keys/${k.id}`);
                        say(`Revoked ${k.name}`);
                        await refresh();
                      } catch (err) {
                        showError(error, err);
                      }
                    },
                  },
                  "Revoke",
                )
              : null,
          ),
        ),
      ),
    );
  }
  try {
    await refresh();
  } catch (e) {
    showError(error, e);
  }
}

// ---- usage ---------------------------------------------------------------------------------

const STATUSES = [
  "running",
  "completed",
  "timed_out",
  "memory_exceeded",
  "output_exceeded",
  "crashed",
  "unsupported_syscall",
  "deadlocked",
  "aborted",
];

async function usagePage(): Promise<void> {
  if (!can("usage:read")) {
    page("Usage", h("p", {}, "Reading usage needs a key with the usage:read scope."));
    return;
  }
  const error = alertBox();
  const cards = h("div", { class: "cards" });
  const bucketSelect = h(
    "select",
    {},
    h("option", { value: "hour" }, "Last 24 hours, by hour"),
    h("option", { value: "day" }, "Last 30 days, by day"),
  );
  const chartHost = h("div", {});
  const statusFilter = h(
    "select",
    {},
    h("option", { value: "" }, "any"),
    ...STATUSES.map((s) => h("option", { value: s }, s)),
  );
  const templateFilter = h("select", {}, h("option", { value: "" }, "any"));
  const tableBody = h("tbody", {});
  const newer = h("button", { type: "button", class: "secondary" }, "First page");
  const older = h("button", { type: "button", class: "secondary" }, "Older");
  const pageInfo = h("span", { role: "status" });
  page(
    "Usage",
    error,
    cards,
    h(
      "section",
      { "aria-labelledby": "chart-heading", class: "card" },
      h(
        "div",
        { class: "row" },
        h("h2", { id: "chart-heading" }, "Units used"),
        field("Period", bucketSelect),
      ),
      chartHost,
    ),
    h(
      "section",
      { "aria-labelledby": "executions-heading" },
      h("h2", { id: "executions-heading" }, "Executions"),
      h(
        "div",
        { class: "toolbar" },
        field("Status", statusFilter),
        field("Template", templateFilter),
      ),
      h(
        "div",
        { class: "table-wrap", tabindex: 0, role: "region", "aria-label": "Scrollable table" },
        h(
          "table",
          { "data-testid": "executions" },
          h("caption", {}, "Executions, newest first"),
          h(
            "thead",
            {},
            h(
              "tr",
              {},
              ...["Started", "Execution", "Template", "Status", "Duration", "Units"].map((c) =>
                h("th", { scope: "col" }, c),
              ),
            ),
          ),
          tableBody,
        ),
      ),
      h("div", { class: "pager" }, newer, pageInfo, older),
    ),
  );

  try {
    const list = await templates().catch(() => [] as Template[]);
    templateFilter.append(...list.map((t) => h("option", { value: t.name }, t.name)));
    const usage = await api<{
      executions: number;
      units: number;
      unit: string;
      balance: { balance_units: number; reserved_units: number; available_units: number };
    }>("GET", "/v1/usage");
    const card = (label: string, value: number | string, testid: string) =>
      h(
        "div",
        { class: "card stat" },
        h("span", { class: "label" }, label),
        h("strong", { "data-testid": testid }, String(value)),
      );
    cards.replaceChildren(
      card("Available credits", usage.balance.available_units, "available"),
      card("Held by running work", usage.balance.reserved_units, "reserved"),
      card("Executions this month", usage.executions, "month-executions"),
      card(`Used this month (${usage.unit}s)`, usage.units, "month-units"),
    );
  } catch (e) {
    showError(error, e);
  }

  async function drawChart(): Promise<void> {
    const bucket = bucketSelect.value as "hour" | "day";
    const to = new Date();
    const from = new Date(to.getTime() - (bucket === "hour" ? 24 * 3_600_000 : 30 * 86_400_000));
    const series = await api<{ points: Point[]; from: string; to: string; unit: string }>(
      "GET",
      `/v1/usage/series?bucket=${bucket}&from=${from.toISOString()}&to=${to.toISOString()}`,
    );
    chartHost.replaceChildren(
      usageChart(series.points, series.from, series.to, bucket, series.unit),
    );
  }
  bucketSelect.addEventListener("change", () => void drawChart().catch((e) => showError(error, e)));

  const cursors: (string | null)[] = [null];
  async function listExecutions(): Promise<void> {
    const params = new URLSearchParams({ limit: "20" });
    if (statusFilter.value !== "") params.set("status", statusFilter.value);
    if (templateFilter.value !== "") params.set("template", templateFilter.value);
    const cursor = cursors.at(-1);
    if (cursor) params.set("cursor", cursor);
    const result = await api<{ executions: Execution[]; next_cursor: string | null }>(
      "GET",
      `/v1/executions?${params}`,
    );
    tableBody.replaceChildren(
      ...result.executions.map((e) =>
        h(
          "tr",
          {},
          h("td", {}, when(e.created_at)),
          h("td", {}, h("code", {}, e.id.slice(0, 8))),
          h("td", {}, e.template),
          h("td", {}, h("span", { class: `badge ${e.status}` }, e.status)),
          h("td", { class: "num" }, e.timings === null ? "—" : ms(e.timings.total_ms)),
          h("td", { class: "num" }, e.usage.units ?? "—"),
        ),
      ),
    );
    if (result.executions.length === 0)
      tableBody.append(h("tr", {}, h("td", { colspan: 6 }, "No executions match.")));
    pageInfo.textContent = `Page ${cursors.length}`;
    newer.disabled = cursors.length === 1;
    older.disabled = result.next_cursor === null;
    older.onclick = () => {
      cursors.push(result.next_cursor);
      void listExecutions().catch((e) => showError(error, e));
    };
  }
  newer.addEventListener("click", () => {
    cursors.splice(1);
    void listExecutions().catch((e) => showError(error, e));
  });
  for (const filter of [statusFilter, templateFilter]) {
    filter.addEventListener("change", () => {
      cursors.splice(1);
      void listExecutions().catch((e) => showError(error, e));
    });
  }
  await Promise.all([drawChart(), listExecutions()]).catch((e) => showError(error, e));
}

// ---- routing -------------------------------------------------------------------------------

const PAGES: Record<string, () => Promise<void>> = {
  playground: playgroundPage,
  sessions: sessionsPage,
  keys: keysPage,
  usage: usagePage,
};

function route(): void {
  toast.hidden = true;
  const current = session();
  if (current === null) {
    signInPage();
    return;
  }
  nav.hidden = false;
  who.hidden = false;
  whoText.textContent = `Signed in (${current.scopes.join(", ")}) until ${current.expiresAt.toLocaleTimeString()}`;
  const name = location.hash.replace(/^#\/?/, "") || "playground";
  const render = PAGES[name] ?? playgroundPage;
  for (const link of nav.querySelectorAll("a")) {
    if (link.dataset.page === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  void render().then(() => main.focus({ preventScroll: true }));
}

document
  .getElementById("sign-out")
  ?.addEventListener("click", () => signOut("Signed out. The token was forgotten."));
window.addEventListener("hashchange", route);
route();
