// The README and docs/ stay true to the tree: every relative link reaches an existing file (and
// an existing heading where it names one), and the README stays short enough to read.
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const README_MAX_LINES = 250;

const documents = [
  "README.md",
  ...readdirSync(join(root, "docs"))
    .filter((name) => name.endsWith(".md"))
    .map((name) => `docs/${name}`),
];

/** The text outside fenced code blocks and inline code spans, where links are links. */
function prose(markdown: string): string {
  return markdown.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, "").replace(/`[^`\n]*`/g, "");
}

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens. */
function slug(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, "")
    .replace(/\s/g, "-");
}

/** The anchors of a markdown file's headings, numbered as GitHub numbers repeated ones. */
function anchors(markdown: string): Set<string> {
  const seen = new Map<string, number>();
  const result = new Set<string>();
  for (const match of markdown
    .replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, "")
    .matchAll(/^#{1,6}\s+(.+?)\s*#*\s*$/gm)) {
    const base = slug(match[1]!);
    const count = seen.get(base) ?? 0;
    seen.set(base, count + 1);
    result.add(count === 0 ? base : `${base}-${count}`);
  }
  return result;
}

interface Link {
  from: string;
  target: string;
}

function relativeLinks(file: string): Link[] {
  const text = prose(readFileSync(join(root, file), "utf8"));
  const links: Link[] = [];
  for (const match of text.matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) {
    const target = match[1]!;
    if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // http:, https:, mailto:
    links.push({ from: file, target });
  }
  return links;
}

/** What is wrong with one link, or undefined. */
function brokenReason(link: Link): string | undefined {
  const [pathPart, anchor] = link.target.split("#", 2) as [string, string | undefined];
  const targetFile =
    pathPart === "" ? join(root, link.from) : resolve(root, dirname(link.from), pathPart);
  if (!targetFile.startsWith(root)) return "points outside the repository";
  if (!existsSync(targetFile)) return `no such file ${relative(root, targetFile)}`;
  if (anchor === undefined || anchor === "") return undefined;
  if (statSync(targetFile).isDirectory() || !targetFile.endsWith(".md"))
    return "an anchor into a file that is not markdown";
  if (!anchors(readFileSync(targetFile, "utf8")).has(anchor))
    return `no heading #${anchor} in ${relative(root, targetFile)}`;
  return undefined;
}

describe("documentation links", () => {
  it("finds the documents", () => {
    expect(documents).toContain("README.md");
    expect(documents.length).toBeGreaterThan(1);
  });

  it("every relative link in README.md and docs/*.md reaches a file and heading that exist", () => {
    const broken = documents
      .flatMap(relativeLinks)
      .map((link) => ({ link, reason: brokenReason(link) }))
      .filter(({ reason }) => reason !== undefined)
      .map(({ link, reason }) => `${link.from}: (${link.target}) ${reason}`);
    expect(broken).toEqual([]);
  });

  it(`README.md has at most ${README_MAX_LINES} lines`, () => {
    const lines = readFileSync(join(root, "README.md"), "utf8").split("\n");
    if (lines.at(-1) === "") lines.pop();
    expect(lines.length).toBeLessThanOrEqual(README_MAX_LINES);
  });

  it("slugs headings as GitHub does", () => {
    expect(slug("The daemon's seccomp filter")).toBe("the-daemons-seccomp-filter");
    expect(slug("Session checkpoints (`bench sessions`)")).toBe(
      "session-checkpoints-bench-sessions",
    );
    expect(slug("What `npm start` does")).toBe("what-npm-start-does");
  });
});
