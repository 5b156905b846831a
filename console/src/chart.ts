// Units per bucket as stacked SVG bars, one colour per template, with a legend and a table the
// chart summarises (for screen readers, and for exact numbers).
import { h } from "./dom.js";

export interface Point {
  at: string;
  template: string;
  executions: number;
  units: number;
}

const SVG = "http://www.w3.org/2000/svg";
const svg = (tag: string, attrs: Record<string, string | number>) => {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) element.setAttribute(name, String(value));
  return element;
};

export function usageChart(
  points: Point[],
  from: string,
  to: string,
  bucket: "hour" | "day",
  unit: string,
): HTMLElement {
  const size = bucket === "hour" ? 3_600_000 : 86_400_000;
  const start = Date.parse(from);
  const count = Math.max(1, Math.round((Date.parse(to) - start) / size));
  const templates = [...new Set(points.map((p) => p.template))].sort();
  const stacks = Array.from({ length: count }, () => new Map<string, number>());
  for (const p of points) {
    const index = Math.floor((Date.parse(p.at) - start) / size);
    const stack = stacks[index];
    if (stack !== undefined) stack.set(p.template, (stack.get(p.template) ?? 0) + p.units);
  }
  const totals = stacks.map((s) => [...s.values()].reduce((a, b) => a + b, 0));
  const max = Math.max(1, ...totals);
  const total = totals.reduce((a, b) => a + b, 0);
  const width = 720;
  const height = 200;
  const pad = { left: 44, bottom: 22, top: 8 };
  const barWidth = (width - pad.left) / count;
  const chart = svg("svg", {
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-label": `${total} ${unit}s used in this period`,
    class: "chart",
  });
  const plot = height - pad.bottom - pad.top;
  for (const fraction of [0, 0.5, 1]) {
    const y = pad.top + plot * (1 - fraction);
    chart.append(svg("line", { x1: pad.left, x2: width, y1: y, y2: y, class: "grid" }));
    const label = svg("text", { x: pad.left - 6, y: y + 4, "text-anchor": "end", class: "axis" });
    label.textContent = String(Math.round(max * fraction));
    chart.append(label);
  }
  stacks.forEach((stack, i) => {
    let y = pad.top + plot;
    templates.forEach((template, t) => {
      const units = stack.get(template) ?? 0;
      if (units === 0) return;
      const barHeight = (units / max) * plot;
      y -= barHeight;
      const rect = svg("rect", {
        x: pad.left + i * barWidth + 1,
        y,
        width: Math.max(1, barWidth - 2),
        height: barHeight,
        class: `series-${t % 6}`,
      });
      const title = svg("title", {});
      title.textContent = `${new Date(start + i * size).toLocaleString()}: ${template} ${units}`;
      rect.append(title);
      chart.append(rect);
    });
    if (i % Math.ceil(count / 6) === 0) {
      const label = svg("text", { x: pad.left + i * barWidth, y: height - 6, class: "axis" });
      const at = new Date(start + i * size);
      label.textContent =
        bucket === "hour"
          ? `${String(at.getHours()).padStart(2, "0")}:00`
          : at.toLocaleDateString(undefined, { month: "short", day: "numeric" });
      chart.append(label);
    }
  });
  const legend = h(
    "ul",
    { class: "legend" },
    ...templates.map((template, t) =>
      h("li", {}, h("span", { class: `swatch series-${t % 6}`, "aria-hidden": "true" }), template),
    ),
  );
  const byTemplate = templates.map(
    (template) =>
      [
        template,
        points.filter((p) => p.template === template).reduce((n, p) => n + p.units, 0),
      ] as const,
  );
  return h(
    "figure",
    { class: "chart-figure" },
    chart,
    legend,
    h(
      "figcaption",
      {},
      h("span", { "data-testid": "chart-total" }, `Total: ${total} ${unit}s`),
      byTemplate.length === 0
        ? " — nothing ran in this period"
        : ` (${byTemplate.map(([t, u]) => `${t} ${u}`).join(", ")})`,
    ),
  );
}
