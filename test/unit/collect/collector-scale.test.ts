import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Collector, type CollectorController } from "../../../coordinator/collect/collector.js";

/**
 * The collector's CPU cost must grow linearly with its rows. Counted, not timed: every walk of a
 * Map as large as the collection (its row table) adds that Map's size, and the total per row must
 * stay a small constant. Scanning every row per dispatch and per finished row made it grow with
 * the row count (quadratic overall: 40k rows took minutes of CPU with an instant /run).
 */
let dir: string;
let server: Server;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collector-scale-"));
});
afterEach(async () => {
  vi.restoreAllMocks();
  server?.closeAllConnections();
  server?.close();
  await rm(dir, { recursive: true, force: true });
});

/** Rows walked by Map iterations over at least `size` entries, from now on. */
function countWalksOfMapsOver(size: number): () => number {
  let walked = 0;
  const proto = Map.prototype as unknown as Record<string | symbol, (...args: unknown[]) => unknown>;
  for (const method of ["values", "entries", "keys", "forEach", Symbol.iterator] as const) {
    const original = proto[method]!;
    vi.spyOn(proto, method as never).mockImplementation(function (this: Map<unknown, unknown>, ...args: unknown[]) {
      if (this.size >= size) walked += this.size;
      return original.apply(this, args);
    } as never);
  }
  return () => walked;
}

async function instantRunServer(): Promise<string> {
  server = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ reward: 1 }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server.address() as { port: number }).port}/run`;
}

/** Enough of a controller for a run without checkpoints or failures. */
const controller = {
  list: async () => ({ latest: null, checkpoints: [] }),
  status: async () => ({ checkpoint: null, participants: [] }),
  retire: async () => ({ participants: [] }),
  forget: async (req: { rollout_ids: string[] }) => ({ forgotten: req.rollout_ids }),
} as unknown as CollectorController;

describe("collector scale", () => {
  it("walks its row table a bounded number of times per row, not once per dispatch and per finished row", { timeout: 60_000 }, async () => {
    const rows = 1000;
    const url = await instantRunServer();
    const collector = new Collector({
      rows: Array.from({ length: rows }, (_, i) => ({ rolloutId: `r${i}`, task: {} })),
      runUrl: url,
      outPath: join(dir, "results.jsonl"),
      checkpointDir: dir,
      controller,
      concurrency: 32,
      logger: pino({ level: "silent" }),
    });
    const walked = countWalksOfMapsOver(rows);
    await collector.start();
    expect(await collector.run()).toMatchObject({ rows, finished: rows, failed: 0 });
    // Start-up and the summary walk the rows once or twice; a walk per dispatch would be ~rows².
    expect(walked() / rows).toBeLessThanOrEqual(4);
  });
});
