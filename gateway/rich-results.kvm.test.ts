// Rich results end to end on KVM: one gateway (PGlite) on a loopback port and the REAL supervised
// daemon serving the python-data template (built at start). A pandas + matplotlib program
// through POST /v1/executions: its chart comes back as a PNG that decodes, of the size asked for,
// with the colour it filled where it filled it; its DataFrame as text/html; a file it wrote
// under /work/out downloads byte for byte, for its account only. The official MCP client gets
// the chart as image content; a session cell answers the same results.
// Its waits are multiplied by SANDFORK_TEST_TIME_SCALE (1 native, ~15 in QEMU).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { timeScale } from "./testing/kvm-tier.js";
import { decodePng } from "./testing/png.js";
import { type ServedGateway, startServedGateway } from "./testing/served-gateway.js";
import { expectProblem } from "./testing/test-gateway.js";

const CREDITS = 100_000;
let served: ServedGateway;

// Building python-data boots its imports (pandas, SciPy, scikit-learn): minutes on a busy host.
beforeAll(async () => {
  served = await startServedGateway({ templates: ["python-data"], bootTimeoutMs: 180_000 });
}, 300_000 * timeScale);

afterAll(async () => {
  await served?.dispose();
});

/**
 * A 4 x 3 inch figure at 100 dpi whose axes are filled red from edge to edge (no frame, no
 * ticks): its centre is red and its corner the figure's white; then a DataFrame as the value.
 */
const CHART = `
import pandas as pd
import matplotlib.pyplot as plt
frame = pd.DataFrame({"x": [1, 2, 3, 4], "y": [1, 4, 9, 16]})
figure = plt.figure(figsize=(4, 3), dpi=100)
axes = figure.add_axes([0.1, 0.1, 0.8, 0.8])
axes.set_xlim(0, 1)
axes.set_ylim(0, 1)
axes.axvspan(0, 1, color="#ff0000")
axes.set_axis_off()
frame
`;

/** Every byte value, 40 times over: a file a text round trip would change. */
const DATA_PROGRAM = `
import os
os.makedirs("/work/out/sub", exist_ok=True)
with open("/work/out/sub/data.bin", "wb") as f:
    f.write(bytes(range(256)) * 40)
print("written")
`;
const DATA = Buffer.concat(Array.from({ length: 40 }, () => Buffer.from([...Array(256).keys()])));

interface RichResult {
  type: string;
  data: string;
}

/** The chart a run answered: a PNG of the figure's size, red in the middle, white at a corner. */
function expectRedChart(base64: string): void {
  const png = decodePng(Buffer.from(base64, "base64"));
  // bbox_inches="tight" trims the figure to what was drawn (the axes, 320 x 240) plus a margin.
  expect(png.width).toBeGreaterThanOrEqual(320);
  expect(png.width).toBeLessThanOrEqual(400);
  expect(png.height).toBeGreaterThanOrEqual(240);
  expect(png.height).toBeLessThanOrEqual(300);
  expect(png.pixel(png.width >> 1, png.height >> 1)).toEqual([255, 0, 0, 255]);
  expect(png.pixel(1, 1)).toEqual([255, 255, 255, 255]);
}

async function run(key: string, code: string) {
  const response = await served.gw.call("POST", "/v1/executions", {
    credential: key,
    body: { template: "python-data", code, timeout_ms: 20_000 * timeScale },
  });
  const text = await response.text();
  expect(response.status, text).toBe(200);
  return JSON.parse(text) as {
    id: string;
    status: string;
    stdout: string;
    stderr: string;
    results: RichResult[];
    files: { path: string; size: number; url: string | null }[];
  };
}

describe("rich results of python-data through the gateway", () => {
  it("a pandas + matplotlib program answers its chart as a PNG and its DataFrame as HTML", async () => {
    const { key } = await served.gw.issue({ credits: CREDITS });
    const answer = await run(key, CHART);
    expect(answer.status, answer.stderr).toBe("completed");
    expect(answer.results.map((r) => r.type)).toEqual(["image/png", "text/html", "text/plain"]);
    const [chart, table, value] = answer.results as [RichResult, RichResult, RichResult];
    expectRedChart(chart.data);
    expect(table.data).toMatch(/^<div>[\s\S]*<table border="1" class="dataframe">/);
    expect(table.data).toContain("<td>16</td>");
    expect(value.data).toMatch(/^\s+x\s+y\n0\s+1\s+1\n/);
    expect(answer.files).toEqual([]);
  });

  it("a file under /work/out downloads byte for byte, by its account only", async () => {
    const owner = await served.gw.issue({ credits: CREDITS });
    const answer = await run(owner.key, DATA_PROGRAM);
    expect(answer.stdout).toBe("written\n");
    expect(answer.files).toEqual([
      {
        path: "sub/data.bin",
        size: DATA.length,
        url: `/v1/executions/${answer.id}/files/sub/data.bin`,
        expires_at: expect.any(String),
      },
    ]);
    const url = new URL(answer.files[0]?.url as string, served.url);
    const download = (key: string) => fetch(url, { headers: { authorization: `Bearer ${key}` } });
    const mine = await download(owner.key);
    expect(mine.status).toBe(200);
    expect(Buffer.from(await mine.arrayBuffer()).equals(DATA)).toBe(true);
    const stranger = await served.gw.issue({ credits: CREDITS });
    await expectProblem(await download(stranger.key), 404, "not-found");
  });

  it("MCP's run_code returns the chart as image content to the official client", async () => {
    const { key } = await served.gw.issue({ credits: CREDITS });
    const mcp = new Client({ name: "sandfork-test", version: "1.0.0" });
    await mcp.connect(
      new StreamableHTTPClientTransport(new URL("/mcp", served.url), {
        requestInit: { headers: { authorization: `Bearer ${key}` } },
      }),
    );
    try {
      const result = await mcp.callTool({
        name: "run_code",
        arguments: {
          language: "python",
          template: "python-data",
          code: CHART,
          timeout_ms: 20_000 * timeScale,
        },
      });
      expect(result.isError, JSON.stringify(result).slice(0, 2000)).toBeFalsy();
      const content = result.content as { type: string; data?: string; mimeType?: string }[];
      expect(content.map((c) => c.type)).toEqual(["text", "image"]);
      expect(content[1]?.mimeType).toBe("image/png");
      expectRedChart(content[1]?.data as string);
      expect(result.structuredContent).toMatchObject({
        status: "completed",
        results: [
          {
            type: "image/png",
            description: expect.stringMatching(/^image\/png, \d+x\d+ px, \d+ bytes$/),
          },
          { type: "text/html", data: expect.stringContaining('class="dataframe"') },
          { type: "text/plain" },
        ],
      });
    } finally {
      await mcp.close();
    }
  });

  it("a session cell answers its chart and table too", async () => {
    const { key } = await served.gw.issue({ credits: CREDITS });
    const created = await served.gw.call("POST", "/v1/sessions", {
      credential: key,
      body: { template: "python-data" },
    });
    expect(created.status, await created.clone().text()).toBe(201);
    const { id } = (await created.json()) as { id: string };
    try {
      const cell = await served.gw.call("POST", `/v1/sessions/${id}/executions`, {
        credential: key,
        body: { code: CHART, timeout_ms: 20_000 * timeScale },
      });
      const text = await cell.text();
      expect(cell.status, text).toBe(200);
      const body = JSON.parse(text) as { results: RichResult[]; value: string };
      expect(body.results.map((r) => r.type)).toEqual(["image/png", "text/html", "text/plain"]);
      expectRedChart((body.results[0] as RichResult).data);
      expect(body.results[2]?.data).toBe(body.value);
    } finally {
      await served.gw.call("DELETE", `/v1/sessions/${id}`, { credential: key });
    }
  });
});
