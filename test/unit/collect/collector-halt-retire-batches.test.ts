import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { collectorIn, idleController } from "../../support/collector-fixture.js";
import { deferred } from "../../support/deferred.js";
import { waitUntil } from "../../support/wait-until.js";

/**
 * A SIGINT or SIGHUP (halt) while the attempts of failed rows are being retired: the batch already
 * sent ends, and no other goes out. The exit after halt() closes NATS and lets go of the lock, so a
 * later batch raced it; the dispatch log still names those attempts, and the next start retires
 * them. retireQueued's loop used to send every batch still queued (more than RETIRE_BATCH, 1024).
 */
const ROWS = 1025;

let dir: string;
let server: Server | undefined;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collector-halt-retire-"));
});
afterEach(async () => {
  server?.closeAllConnections();
  server?.close();
  server = undefined;
  await rm(dir, { recursive: true, force: true });
});

/** Every /run fails (500): with --max-attempts 1 each row fails for good and queues its attempt's retire. */
async function failingRunServer(): Promise<string> {
  server = createServer((req, res) => {
    req.resume();
    req.on("end", () => res.writeHead(500, { "content-type": "application/json" }).end("{}"));
  });
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server!.address() as { port: number }).port}/run`;
}

describe("halt() while failed rows' attempts are being retired", () => {
  it("sends no further retire batch once halt has returned", async () => {
    const batches: number[] = [];
    const firstHeld = deferred();
    const controller = idleController({
      retire: async (req: { episode_ids: unknown[] }) => {
        batches.push(req.episode_ids.length);
        // The first batch is held until halt() has returned: the rest queue up behind it meanwhile.
        if (batches.length === 1) await firstHeld.promise;
        return { participants: [] };
      },
    });
    const collector = collectorIn(dir, await failingRunServer(), controller, {
      rows: Array.from({ length: ROWS }, (_, i) => ({ rolloutId: `r${i}`, task: {} })),
      maxAttempts: 1,
      concurrency: 8,
    });
    await collector.start();
    const run = collector.run();
    await waitUntil(() => batches.length === 1 && collector.summary().failed === ROWS, "every row failed, the first retire held");
    await collector.halt();
    firstHeld.resolve();
    await run;
    // Taken once the lock is free: the retires queued behind the held one have run (or been skipped).
    expect(await collector.checkpoint({ stop: false })).toEqual({ published: false, checkpointId: "" });
    expect(batches).toHaveLength(1);
  });
});
