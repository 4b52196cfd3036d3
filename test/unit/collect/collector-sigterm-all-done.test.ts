import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { CollectorController } from "../../../coordinator/collect/collector.js";
import { collectorIn, idleController } from "../../support/collector-fixture.js";
import { waitUntil } from "../../support/wait-until.js";

/**
 * A SIGTERM (the stop checkpoint) asked for once every row is done, but before the workers have
 * returned: the last row's line is still being appended to --out. Nothing is left to run or to
 * continue, so nothing is checkpointed and the collection ends with its own code (0), not 75. The
 * checkpoint used to go ahead: a stop checkpoint of an empty scope, the Gym parked, exit 75 and a
 * requeued job that only closed it again.
 */
const appends = vi.hoisted(() => ({ hold: undefined as Promise<void> | undefined, held: 0 }));
vi.mock("../../../coordinator/collect/results-file.js", async (importOriginal) => {
  const original = await importOriginal<typeof import("../../../coordinator/collect/results-file.js")>();
  return {
    ...original,
    appendResultText: async (...args: Parameters<typeof original.appendResultText>) => {
      if (appends.hold) {
        appends.held++;
        await appends.hold;
      }
      return original.appendResultText(...args);
    },
  };
});

let dir: string;
let server: Server | undefined;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collector-sigterm-done-"));
});
afterEach(async () => {
  appends.hold = undefined;
  appends.held = 0;
  server?.closeAllConnections();
  server?.close();
  server = undefined;
  await rm(dir, { recursive: true, force: true });
});

async function instantRunServer(): Promise<string> {
  server = createServer((req, res) => {
    req.resume();
    req.on("end", () => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1 })));
  });
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server!.address() as { port: number }).port}/run`;
}

describe("a SIGTERM once every row is done", () => {
  it("while the last row's result is being appended: no stop checkpoint, the collection ends with its own code", async () => {
    const ops: string[] = [];
    const record = (op: string) => async () => {
      ops.push(op);
      throw new Error(`${op} must not be sent: nothing is left to checkpoint`);
    };
    const controller: CollectorController = idleController({ prepare: record("prepare"), commit: record("commit"), publish: record("publish"), resume: record("resume") });
    const collector = collectorIn(dir, await instantRunServer(), controller);
    await collector.start();
    let release!: () => void;
    appends.hold = new Promise<void>((resolve) => (release = resolve));
    const run = collector.run();
    await waitUntil(() => appends.held === 1, "the last row's append");
    // Every row is done (its line on its way to --out); the workers have not returned yet.
    const stop = await collector.checkpoint({ stop: true });
    expect(stop).toEqual({ published: false, checkpointId: "" });
    // What the CLI reads to exit with the collection's own code rather than 75.
    expect(collector.hasEnded).toBe(true);
    expect(ops).toEqual([]);
    release();
    expect(await run).toMatchObject({ rows: 1, finished: 1, failed: 0, stopped: false, checkpoints: 0 });
  });

  it("a timer or SIGUSR1 checkpoint asked for then is skipped too: its prepare would only park the Gym", async () => {
    const ops: string[] = [];
    const controller: CollectorController = idleController({
      prepare: async () => {
        ops.push("prepare");
        throw new Error("prepare must not be sent");
      },
    });
    const collector = collectorIn(dir, await instantRunServer(), controller);
    await collector.start();
    let release!: () => void;
    appends.hold = new Promise<void>((resolve) => (release = resolve));
    const run = collector.run();
    await waitUntil(() => appends.held === 1, "the last row's append");
    expect(await collector.checkpoint({ stop: false })).toEqual({ published: false, checkpointId: "" });
    expect(ops).toEqual([]);
    release();
    expect(await run).toMatchObject({ finished: 1, stopped: false });
  });

  it("a row still pending (not all done): the stop checkpoint goes ahead as before", async () => {
    const ops: string[] = [];
    const controller: CollectorController = idleController({
      prepare: async () => {
        ops.push("prepare");
        return { prepared: false, blockers: ["x"], restarts: [], stopped_at: null };
      },
      resume: async () => {
        ops.push("resume");
        return {};
      },
    });
    const collector = collectorIn(dir, await instantRunServer(), controller, {
      rows: [
        { rolloutId: "a", task: {} },
        { rolloutId: "b", task: {} },
      ],
      concurrency: 1,
    });
    await collector.start();
    let release!: () => void;
    appends.hold = new Promise<void>((resolve) => (release = resolve));
    const run = collector.run();
    await waitUntil(() => appends.held === 1, "the first row's append");
    // b has not been sent: it is pending, so the stop checkpoint is taken (here not prepared).
    expect(collector.hasEnded).toBe(false);
    const stop = collector.checkpoint({ stop: true });
    release();
    expect((await stop).checkpointId).not.toBe("");
    expect(ops).toEqual(["prepare", "resume"]);
    expect(await run).toMatchObject({ finished: 2 });
  });
});
