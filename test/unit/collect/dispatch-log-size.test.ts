import { open, mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { collectorIn, idleController } from "../../support/collector-fixture.js";
import { DispatchLog } from "../../../coordinator/collect/dispatch-log.js";
import type { EpisodeId } from "../../../protocol/index.js";

/**
 * `dispatched.jsonl` holds one line per dispatch of the run, finished rows included, so its size
 * grows with the collection: with 200-character rollout ids a run of about 1.1 million dispatches
 * passes 256 MiB. A crash then must still be resumable: the log is streamed, not read whole.
 */
let dir: string;
let server: Server | undefined;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-dispatch-log-size-"));
});
afterEach(async () => {
  server?.closeAllConnections();
  server?.close();
  server = undefined;
  await rm(dir, { recursive: true, force: true });
});

/** A log of `bytes` and more: filler lines (4096 rollouts with 200-character ids, repeated; --tasks names none), then `last`. */
async function bigLog(path: string, bytes: number, last: EpisodeId[]): Promise<void> {
  const id = (i: number) => `row-${String(i).padStart(8, "0")}-${"x".repeat(187)}`;
  const block = Array.from({ length: 4096 }, (_, i) => `${JSON.stringify({ rollout_id: id(i), attempt: 0 })}\n`).join("");
  const handle = await open(path, "w");
  try {
    await handle.write(`${JSON.stringify({ run_id: "run-big" })}\n`);
    for (let written = 0; written < bytes; written += Buffer.byteLength(block)) await handle.write(block);
    await handle.write(last.map((e) => `${JSON.stringify(e)}\n`).join(""));
    await handle.write('{"rollout_id":"torn'); // a crash mid-append
  } finally {
    await handle.close();
  }
}

describe("the dispatch log of a long collection", () => {
  it("a log over 256 MiB is read: a crashed run of over a million dispatches resumes, retiring its unfinished attempt", { timeout: 60_000 }, async () => {
    const logPath = join(dir, "dispatched.jsonl");
    await bigLog(logPath, (256 << 20) + 1, [{ rollout_id: "a", attempt: 2 }, { rollout_id: "a", attempt: 3 }]);
    const history = await DispatchLog.read(logPath);
    expect(history?.runId).toBe("run-big");
    expect(history?.latest.get("a")).toBe(3);

    const sent: EpisodeId[] = [];
    server = createServer((req, res) => {
      let data = "";
      req.on("data", (chunk: Buffer) => (data += chunk.toString()));
      req.on("end", () => {
        const { rollout_id, attempt } = JSON.parse(data) as EpisodeId;
        sent.push({ rollout_id, attempt });
        res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1 }));
      });
    });
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const retired: EpisodeId[][] = [];
    const controller = idleController({ retire: async (req: { episode_ids: EpisodeId[] }) => (retired.push(req.episode_ids), { participants: [] }) });
    await writeFile(join(dir, "results.jsonl"), "");
    const collector = collectorIn(dir, `http://127.0.0.1:${(server.address() as { port: number }).port}/run`, controller);
    await collector.start();
    // Its unfinished attempt, and the 4096 filler rollouts --tasks does not name (attempt 0 each),
    // retired as gone from the tasks file, in requests of at most 1024.
    const retiredIds = retired.flat();
    expect(retiredIds[0]).toEqual({ rollout_id: "a", attempt: 3 });
    expect(new Set(retiredIds.slice(1).map((e) => `${e.rollout_id}@${e.attempt}`)).size).toBe(4096);
    expect(retiredIds.slice(1).every((e) => e.rollout_id.startsWith("row-") && e.attempt === 0)).toBe(true);
    expect(retired.every((batch) => batch.length <= 1024)).toBe(true);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0, restarted: 1 });
    expect(sent).toEqual([{ rollout_id: "a", attempt: 4 }]);
  });

  it("a line longer than any logged attempt is refused with its line number, and dropped as a torn tail when it is the last piece", async () => {
    const logPath = join(dir, "dispatched.jsonl");
    const header = `${JSON.stringify({ run_id: "run-1" })}\n${JSON.stringify({ rollout_id: "a", attempt: 1 })}\n`;
    await writeFile(logPath, `${header}${"y".repeat(3 << 20)}`);
    expect((await DispatchLog.read(logPath))?.latest).toEqual(new Map([["a", 1]]));
    await writeFile(logPath, `${header}${"y".repeat(3 << 20)}\n`);
    await expect(DispatchLog.read(logPath)).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("dispatched.jsonl:3") });
  });
});

describe("a dispatch log line longer than any logged attempt", () => {
  const header = `${JSON.stringify({ run_id: "run-long" })}\n${JSON.stringify({ rollout_id: "r1", attempt: 2 })}\n`;
  it("is refused once its newline comes (invalid_checkpoint_state, naming its line), never held whole", async () => {
    const path = join(dir, "dispatched.jsonl");
    await writeFile(path, `${header}${"x".repeat(3 << 20)}\n`);
    await expect(DispatchLog.read(path)).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("dispatched.jsonl:3: not a logged attempt") });
  });

  it("is dropped as the torn tail when no newline ends it", async () => {
    const path = join(dir, "dispatched.jsonl");
    await writeFile(path, `${header}${"x".repeat(3 << 20)}`);
    expect((await DispatchLog.read(path))?.latest).toEqual(new Map([["r1", 2]]));
  });
});
