import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { CollectorController } from "../../../coordinator/collect/collector.js";
import { DispatchLog } from "../../../coordinator/collect/dispatch-log.js";
import { readResults } from "../../../coordinator/collect/results-file.js";
import { sha256Hex, type EpisodeId } from "../../../protocol/index.js";
import { collectorIn } from "../../support/collector-fixture.js";

/** The run loop's accounting: what the summary and results.jsonl say about each row. */
let dir: string;
let server: Server | undefined;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-run-loop-"));
});
afterEach(async () => {
  server?.closeAllConnections();
  server?.close();
  server = undefined;
  await rm(dir, { recursive: true, force: true });
});

async function runServer(handler: (body: { rollout_id: string; attempt: number }) => { status: number; body: unknown }): Promise<string> {
  server = createServer((req, res) => {
    let data = "";
    req.on("data", (chunk: Buffer) => (data += chunk.toString()));
    req.on("end", () => {
      const reply = handler(JSON.parse(data) as { rollout_id: string; attempt: number });
      res.writeHead(reply.status, { "content-type": "application/json" });
      res.end(JSON.stringify(reply.body));
    });
  });
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server!.address() as { port: number }).port}/run`;
}

/** A coordinator with run-1's published LATEST continuing `continued`; every op succeeds. */
async function controllerWithLatest(id: string, continued: EpisodeId[]): Promise<CollectorController> {
  await mkdir(join(dir, id), { recursive: true });
  const text = `${JSON.stringify({ checkpoint_id: id, run_id: "run-1", created_at: 1, continued, restarted: [] })}\n`;
  await writeFile(join(dir, id, "collection.json"), text);
  const ok = async () => ({});
  return {
    prepare: async () => ({ prepared: true, blockers: [], restarts: [], stopped_at: null }),
    commit: ok,
    publish: ok,
    resume: ok,
    restore: async (req: { checkpoint_id: string }) => ({ checkpoint_id: req.checkpoint_id, participants: [] }),
    retire: async () => ({ participants: [] }),
    forget: async (req: { rollout_ids: string[] }) => ({ forgotten: req.rollout_ids }),
    list: async () => ({ latest: id, checkpoints: [] }),
    status: async () => ({ checkpoint: null, participants: [] }),
    get: async () => ({ latest: true, manifest: { controller_state: { file: "collection.json", sha256: sha256Hex(text) } } }),
  } as unknown as CollectorController;
}

describe("collector run loop accounting", () => {
  it("a restored attempt /run refuses as fenced (stale_attempt) never continued: its row counts as restarted from input, not continued", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const controller = await controllerWithLatest("ckpt-20240101T000000-aaaaaaaa", [{ rollout_id: "a", attempt: 0 }]);
    const sent: number[] = [];
    // The restore landed (a@1 restored), but a clean-up fenced a@1 at the servers: it never starts,
    // and a@2 runs from input.
    const url = await runServer((body) => (sent.push(body.attempt), body.attempt === 1 ? { status: 409, body: { error: { code: "stale_attempt", detail: "fenced" } } } : { status: 200, body: { reward: 1 } }));
    const collector = collectorIn(dir, url, controller, { logger: pino({ level: "silent" }) });
    await collector.start();
    const summary = await collector.run();
    expect(sent).toEqual([1, 2]);
    expect((await readResults(join(dir, "results.jsonl"))).get("a")).toMatchObject({ attempt: 2, continued: false });
    expect(summary).toMatchObject({ finished: 1, failed: 0, continued: 0, restarted: 1 });
  });
});
