import { statSync } from "node:fs";
import { mkdtemp, readFile, rename, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { readTaskRows, type TaskRow } from "../../../coordinator/collect/task-rows.js";
import { collectorIn, idleController } from "../../support/collector-fixture.js";
import { deferred } from "../../support/deferred.js";
import { descriptorsOn } from "../../support/open-descriptors.js";
import { waitUntil } from "../../support/wait-until.js";

/**
 * The collector sends each row's task as read again from a regular tasks file when the row is
 * sent (its rows hold no task), through the descriptor opened at start-up and closed when the
 * collector ends, and sends nothing for a line changed since start-up.
 */
let dir: string;
let server: Server;
const bodies: { rollout_id: string; task: unknown }[] = [];
/** While set, /run answers only once it resolves. */
let held: Promise<void> | undefined;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collector-task-lines-"));
  bodies.length = 0;
  held = undefined;
  server = createServer((req, res) => {
    let data = "";
    req.on("data", (chunk: Buffer) => (data += chunk.toString()));
    req.on("end", async () => {
      bodies.push(JSON.parse(data) as { rollout_id: string; task: unknown });
      await held;
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

/** tasks.jsonl holding `text`, read as a collection does; its inode, to count the descriptors left on it. */
async function tasksFile(text: string) {
  const tasks = join(dir, "tasks.jsonl");
  await writeFile(tasks, text);
  const opened = statSync(tasks);
  return { tasks, opened, rows: await readTaskRows(tasks) };
}

/** A collector of `rows`, one at a time, run until its first row's /run is in flight and held there. */
async function firstRowInFlight(rows: TaskRow[], tasks: string) {
  const collector = collectorIn(dir, runUrl(), idleController(), { rows, tasksPath: tasks, concurrency: 1 });
  await collector.start();
  const release = deferred();
  held = release.promise;
  const running = collector.run();
  await waitUntil(() => bodies.length === 1, "the first row's /run");
  return { collector, release, running };
}

describe("collector with a regular tasks file", () => {
  it("sends every row's task as written, and lets go of the tasks file once the collection ends", async () => {
    const { tasks, opened, rows } = await tasksFile('{"id":"a","task":{"q":"one"}}\n{"q":"two"}\n');
    const collector = collectorIn(dir, runUrl(), idleController(), { rows, tasksPath: tasks, concurrency: 1 });
    await collector.start();
    expect(descriptorsOn(opened)).toBe(1);
    expect(await collector.run()).toMatchObject({ rows: 2, finished: 2 });
    expect(bodies.map((b) => [b.rollout_id, b.task])).toEqual([
      ["a", { q: "one" }],
      ["row-2", { q: "two" }],
    ]);
    expect(descriptorsOn(opened)).toBe(0);
  });

  it("sends the tasks read at start-up when the file is replaced by mv mid-run (its first row in flight)", async () => {
    const { tasks, opened, rows } = await tasksFile('{"id":"a","task":{"q":"one"}}\n{"id":"b","task":{"q":"two"}}\n');
    const { release, running } = await firstRowInFlight(rows, tasks);
    const next = join(dir, "next.jsonl");
    await writeFile(next, '{"id":"a","task":{"q":"ONE"}}\n{"id":"b","task":{"q":"TWO"}}\n');
    await rename(next, tasks);
    release.resolve();
    expect(await running).toMatchObject({ rows: 2, finished: 2 });
    expect(bodies.map((b) => [b.rollout_id, b.task])).toEqual([
      ["a", { q: "one" }],
      ["b", { q: "two" }],
    ]);
    expect(descriptorsOn(opened)).toBe(0);
  });

  it("lets go of the tasks file when its start fails", async () => {
    const { tasks, opened, rows } = await tasksFile('{"id":"a","task":{"q":"one"}}\n');
    const down = idleController({
      status: async () => {
        throw new Error("controller down");
      },
    });
    const collector = collectorIn(dir, runUrl(), down, { rows, tasksPath: tasks });
    expect(descriptorsOn(opened)).toBe(1);
    await expect(collector.start()).rejects.toThrow("controller down");
    expect(descriptorsOn(opened)).toBe(0);
  });

  it("lets go of the tasks file once halted (SIGINT, or after the stop checkpoint), a /run still in flight", async () => {
    const { tasks, opened, rows } = await tasksFile('{"id":"a","task":{"q":"one"}}\n{"id":"b","task":{"q":"two"}}\n');
    const { collector, release, running } = await firstRowInFlight(rows, tasks);
    expect(descriptorsOn(opened)).toBe(1);
    await collector.halt();
    expect(descriptorsOn(opened)).toBe(0);
    release.resolve();
    expect(await running).toMatchObject({ finished: 0 });
    expect(bodies).toHaveLength(1);
  });

  it("fails with invalid_request, sending and logging nothing for it, when a row's line changed since start-up", async () => {
    const { tasks, opened, rows } = await tasksFile('{"id":"a","task":{"q":"one"}}\n');
    const collector = collectorIn(dir, runUrl(), idleController(), { rows, tasksPath: tasks });
    await collector.start();
    expect(descriptorsOn(opened)).toBe(1);
    await writeFile(tasks, '{"id":"a","task":{"q":"ONE"}}\n');
    await expect(collector.run()).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining(`${tasks}:1: changed since`) });
    expect(bodies).toEqual([]);
    expect(descriptorsOn(opened)).toBe(0);
    expect(await readFile(join(dir, "dispatched.jsonl"), "utf8")).not.toContain('"rollout_id":"a"');
  });
});
