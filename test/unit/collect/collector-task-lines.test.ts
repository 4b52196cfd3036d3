import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { readTaskRows } from "../../../coordinator/collect/task-rows.js";
import { collectorIn, idleController } from "../../support/collector-fixture.js";

/**
 * The collector sends each row's task as read again from a regular tasks file when the row is
 * sent (its rows hold no task), and sends nothing for a line changed since start-up.
 */
let dir: string;
let server: Server;
const bodies: { rollout_id: string; task: unknown }[] = [];
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collector-task-lines-"));
  bodies.length = 0;
  server = createServer((req, res) => {
    let data = "";
    req.on("data", (chunk: Buffer) => (data += chunk.toString()));
    req.on("end", () => {
      bodies.push(JSON.parse(data) as { rollout_id: string; task: unknown });
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ reward: 1 }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
});
afterEach(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
  await rm(dir, { recursive: true, force: true });
});

const runUrl = () => `http://127.0.0.1:${(server.address() as { port: number }).port}/run`;

describe("collector with a regular tasks file", () => {
  it("sends every row's task as written", async () => {
    const tasks = join(dir, "tasks.jsonl");
    await writeFile(tasks, '{"id":"a","task":{"q":"one"}}\n{"q":"two"}\n');
    const rows = await readTaskRows(tasks);
    const collector = collectorIn(dir, runUrl(), idleController(), { rows, tasksPath: tasks, concurrency: 1 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ rows: 2, finished: 2 });
    expect(bodies.map((b) => [b.rollout_id, b.task])).toEqual([
      ["a", { q: "one" }],
      ["row-2", { q: "two" }],
    ]);
  });

  it("fails with invalid_request, sending and logging nothing for it, when a row's line changed since start-up", async () => {
    const tasks = join(dir, "tasks.jsonl");
    await writeFile(tasks, '{"id":"a","task":{"q":"one"}}\n');
    const rows = await readTaskRows(tasks);
    const collector = collectorIn(dir, runUrl(), idleController(), { rows, tasksPath: tasks });
    await collector.start();
    await writeFile(tasks, '{"id":"a","task":{"q":"ONE"}}\n');
    await expect(collector.run()).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining(`${tasks}:1: changed since`) });
    expect(bodies).toEqual([]);
    expect(await readFile(join(dir, "dispatched.jsonl"), "utf8")).not.toContain('"rollout_id":"a"');
  });
});
