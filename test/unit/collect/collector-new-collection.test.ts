import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { CollectorController, CollectorOptions } from "../../../coordinator/collect/collector.js";
import { waitUntil } from "../../support/wait-until.js";
import { DispatchLog } from "../../../coordinator/collect/dispatch-log.js";
import { appendResult } from "../../../coordinator/collect/results-file.js";
import { CheckpointError, sha256Hex, type EpisodeId } from "../../../protocol/index.js";
import { collectorIn, idleController } from "../../support/collector-fixture.js";

/**
 * A coordinator keeps one checkpoint root, and collect keeps `dispatched.jsonl` there. A later,
 * different collection in that root (another --tasks or --out, the normal way to run a second job)
 * used to take itself for the restart of the earlier one: every attempt the earlier log named that
 * its own --out did not hold counted as unfinished, so the earlier run's finished rows were retired
 * (their model ledgers deleted) and sent again. The log's header now names its collection: another
 * one is refused, or abandoned with --new-collection (its unfinished attempts retired, its finished
 * rows left alone, nothing of it restored).
 */
let dir: string;
let server: Server | undefined;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-new-collection-"));
});
afterEach(async () => {
  server?.closeAllConnections();
  server?.close();
  server = undefined;
  await rm(dir, { recursive: true, force: true });
});

/** A `/run` that answers at once, recording `<rollout_id>@<attempt>`. */
async function runServer(sent: string[]): Promise<string> {
  server = createServer((req, res) => {
    let data = "";
    req.on("data", (chunk: Buffer) => (data += chunk.toString()));
    req.on("end", () => {
      const body = JSON.parse(data) as EpisodeId;
      sent.push(`${body.rollout_id}@${body.attempt}`);
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1 }));
    });
  });
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server!.address() as { port: number }).port}/run`;
}

type Call = { op: string; req: Record<string, unknown> };

/**
 * A coordinator whose LATEST is run `runId`'s checkpoint continuing `continued` (nothing published
 * when `runId` is undefined), with `open` open; it records every op that changes something.
 */
async function coordinator(latest?: { runId: string; continued: EpisodeId[] }, open: { checkpoint_id: string; phase: string } | null = null) {
  const calls: Call[] = [];
  const id = "ckpt-20240101T000000-aaaaaaaa";
  let sha256 = "";
  if (latest) {
    await mkdir(join(dir, id), { recursive: true });
    const text = `${JSON.stringify({ checkpoint_id: id, run_id: latest.runId, created_at: 1, continued: latest.continued, restarted: [] })}\n`;
    await writeFile(join(dir, id, "collection.json"), text);
    sha256 = sha256Hex(text);
  }
  const state = { open };
  const record = (op: string, reply: (req: Record<string, unknown>) => unknown) => async (req: Record<string, unknown>) => {
    calls.push({ op, req });
    return reply(req);
  };
  const controller = idleController({
    list: async () => ({ latest: latest ? id : null, checkpoints: [] }),
    status: async () => ({ checkpoint: state.open, participants: [] }),
    get: async () => ({ latest: true, manifest: { controller_state: { file: "collection.json", sha256 } } }),
    retire: record("retire", () => {
      if (state.open && state.open.phase !== "restored") throw new CheckpointError("invalid_phase", `retire is refused while ${state.open.checkpoint_id} is open`);
      return { participants: [] };
    }),
    forget: record("forget", (req) => ({ forgotten: req.rollout_ids })),
    restore: record("restore", (req) => {
      state.open = { checkpoint_id: String(req.checkpoint_id), phase: "restored" };
      return { checkpoint_id: req.checkpoint_id, participants: [] };
    }),
    resume: record("resume", () => {
      state.open = null;
      return {};
    }),
  } as never);
  return { calls, controller, state, checkpointId: id };
}

const ops = (calls: Call[], op: string) => calls.filter((c) => c.op === op).map((c) => c.req.episode_ids ?? c.req.rollout_ids);
const forgotten = (calls: Call[]) => calls.filter((c) => c.op === "forget").flatMap((c) => c.req.rollout_ids as string[]).sort();

const finished = (rollout_id: string, attempt: number) => ({ rollout_id, attempt, reward: 1, continued: false, finished_at: 1, response: {} });

/**
 * The earlier collection A: --tasks tasks-a.jsonl, --out results-a.jsonl, run "run-a". It finished
 * a (attempt 0) and c (attempt 1, after a retire: its forget may have died with it); b was in flight.
 */
async function earlierCollection(options: { header?: "named" | "older"; out?: boolean } = {}) {
  const tasks = join(dir, "tasks-a.jsonl");
  const out = join(dir, "results-a.jsonl");
  const log = join(dir, "dispatched.jsonl");
  const attempts = [
    { rollout_id: "a", attempt: 0 },
    { rollout_id: "b", attempt: 0 },
    { rollout_id: "c", attempt: 1 },
  ];
  if (options.header === "older") {
    // Written by a collector before the header named its collection.
    await writeFile(log, `${JSON.stringify({ run_id: "run-a" })}\n${attempts.map((e) => JSON.stringify(e)).join("\n")}\n`);
  } else {
    await DispatchLog.create(log, "run-a", attempts, undefined, [], { tasks, out, rolloutIdPrefix: "" });
  }
  if (options.out !== false) {
    await appendResult(out, finished("a", 0));
    await appendResult(out, finished("c", 1));
  }
  return { tasks, out, log };
}

/** The later collection B (or, with `as`, another start), over rows `rows`. */
function later(controller: CollectorController, runUrl: string, options: Partial<CollectorOptions> & { rowIds?: string[] } = {}) {
  const { rowIds = ["a", "x"], ...rest } = options;
  return collectorIn(dir, runUrl, controller, {
    rows: rowIds.map((rolloutId) => ({ rolloutId, task: {} })),
    outPath: join(dir, "results-b.jsonl"),
    tasksPath: join(dir, "tasks-b.jsonl"),
    retryPauses: { resendS: 0.01, unresumedS: 0.05, retireS: 0.01, unreachableS: 0.01 },
    ...rest,
  });
}

describe("a later collection in the same checkpoint root", () => {
  it("with another --tasks and --out is refused (checkpoint_conflict) before anything is retired, restored or written: the earlier run's finished rows keep their ledgers", async () => {
    const a = await earlierCollection();
    const { calls, controller } = await coordinator({ runId: "run-a", continued: [{ rollout_id: "b", attempt: 0 }] });
    const logBefore = await readFile(a.log, "utf8");
    const sent: string[] = [];
    const collector = later(controller, await runServer(sent));
    const error = await collector.start().then(() => undefined, (e: unknown) => e);
    // Before: a@0, finished in results-a.jsonl, was retired (its ledger deleted) and b restored.
    expect(calls).toEqual([]);
    expect(error).toBeInstanceOf(CheckpointError);
    expect((error as CheckpointError).code).toBe("checkpoint_conflict");
    const detail = (error as CheckpointError).message;
    for (const named of ["run-a", a.tasks, a.out, join(dir, "tasks-b.jsonl"), join(dir, "results-b.jsonl"), "--new-collection"]) expect(detail).toContain(named);
    expect(await readFile(a.log, "utf8")).toBe(logBefore);
    expect(existsSync(join(dir, "results-b.jsonl"))).toBe(false);
    expect(sent).toEqual([]);
  });

  it.each([
    ["only --out differs", { tasksPath: "TASKS_A" }],
    ["only --rollout-id-prefix differs", { tasksPath: "TASKS_A", outPath: "OUT_A", rolloutIdPrefix: "b." }],
  ])("%s: refused too", async (_name, spelled) => {
    const a = await earlierCollection();
    const { calls, controller } = await coordinator();
    const fill = (v: string | undefined) => (v === "TASKS_A" ? a.tasks : v === "OUT_A" ? a.out : v);
    const options = Object.fromEntries(Object.entries(spelled).map(([k, v]) => [k, fill(v)]));
    const error = await later(controller, await runServer([]), options).start().then(() => undefined, (e: unknown) => e);
    expect((error as CheckpointError).code).toBe("checkpoint_conflict");
    expect(calls).toEqual([]);
  });

  it("the same collection spelled another way (a link to its directory) is continued, as after a crash", async () => {
    const a = await earlierCollection();
    await symlink(dir, join(dir, "link"));
    const { calls, controller } = await coordinator();
    const sent: string[] = [];
    await writeFile(a.tasks, "");
    const collector = later(controller, await runServer(sent), { rowIds: ["a", "b", "c"], tasksPath: join(dir, "link", "tasks-a.jsonl"), outPath: join(dir, "link", "results-a.jsonl") });
    await collector.start();
    expect(ops(calls, "retire")).toEqual([[{ rollout_id: "b", attempt: 0 }]]);
    expect(await collector.run()).toMatchObject({ finished: 3, failed: 0 });
    expect(sent).toEqual(["b@1"]);
  });

  it("the same collection spelled another way is continued also while its --out is not there yet (a crash before any row finished)", async () => {
    const a = await earlierCollection({ out: false });
    await symlink(dir, join(dir, "link"));
    const { calls, controller } = await coordinator();
    const sent: string[] = [];
    await writeFile(a.tasks, "");
    const collector = later(controller, await runServer(sent), { rowIds: ["a", "b", "c"], tasksPath: join(dir, "link", "tasks-a.jsonl"), outPath: join(dir, "link", "results-a.jsonl") });
    // Before: refused (checkpoint_conflict): an --out not there was compared only as written.
    await collector.start();
    expect(ops(calls, "retire")).toEqual([[{ rollout_id: "a", attempt: 0 }, { rollout_id: "b", attempt: 0 }, { rollout_id: "c", attempt: 1 }]]);
    expect(await collector.run()).toMatchObject({ finished: 3, failed: 0 });
    expect(sent.sort()).toEqual(["a@1", "b@1", "c@2"]);
  });

  it("a log written before the header named its collection is continued whatever the flags (an upgrade mid-run still resumes)", async () => {
    await earlierCollection({ header: "older" });
    const { calls, controller } = await coordinator();
    const sent: string[] = [];
    const collector = later(controller, await runServer(sent), { rowIds: ["a", "b"] });
    await collector.start();
    // Today's behaviour, kept: a@0 and b@0 are not in results-b.jsonl, so they are retired and sent
    // again as attempt 1; c, which --tasks no longer names, is retired as gone.
    expect(ops(calls, "retire")).toEqual([[{ rollout_id: "a", attempt: 0 }, { rollout_id: "b", attempt: 0 }, { rollout_id: "c", attempt: 1 }]]);
    expect(await collector.run()).toMatchObject({ finished: 2 });
    expect(sent.sort()).toEqual(["a@1", "b@1"]);
    // The new log names this collection from now on.
    expect((await DispatchLog.read(join(dir, "dispatched.jsonl")))!.collection).toEqual({ tasks: join(dir, "tasks-b.jsonl"), out: join(dir, "results-b.jsonl"), rolloutIdPrefix: "" });
  });
});

describe("a later collection in the same root after the earlier one finished", () => {
  it("starts without --new-collection: every attempt the earlier log names is finished in its --out, so nothing is retired", async () => {
    const a = await earlierCollection();
    await appendResult(a.out, finished("b", 0)); // b, in flight before, finished too
    const { calls, controller } = await coordinator();
    const sent: string[] = [];
    const collector = later(controller, await runServer(sent));
    await collector.start();
    expect(ops(calls, "retire")).toEqual([]);
    expect((await DispatchLog.read(join(dir, "dispatched.jsonl")))!.collection).toEqual({ tasks: join(dir, "tasks-b.jsonl"), out: join(dir, "results-b.jsonl"), rolloutIdPrefix: "" });
    expect(await collector.run()).toMatchObject({ rows: 2, finished: 2 });
    expect(sent.sort()).toEqual(["a@0", "x@0"]);
  });

  it("with the earlier collection's --out is refused (invalid_request), nothing retired: its rows would be taken for the new one's", async () => {
    const a = await earlierCollection();
    await appendResult(a.out, finished("b", 0));
    const { calls, controller } = await coordinator();
    for (const newCollection of [false, true]) {
      const error = await later(controller, await runServer([]), { outPath: a.out, newCollection }).start().then(() => undefined, (e: unknown) => e);
      server?.close();
      expect((error as CheckpointError).code).toBe("invalid_request");
      expect((error as CheckpointError).message).toContain("needs an --out of its own");
    }
    expect(calls).toEqual([]);
  });
});

describe("collect --new-collection", () => {
  it("abandons the earlier collection: its unfinished attempts retired and forgotten, its finished rows left alone, nothing of it restored, a fresh log", async () => {
    const a = await earlierCollection();
    const { calls, controller } = await coordinator({ runId: "run-a", continued: [{ rollout_id: "b", attempt: 0 }] });
    const outBefore = await readFile(a.out, "utf8");
    const sent: string[] = [];
    const warnings: string[] = [];
    const collector = later(controller, await runServer(sent), { newCollection: true, logger: pino({ level: "warn" }, { write: (line: string) => warnings.push(line) }) });
    await collector.start();
    // Only b@0 (unfinished by results-a.jsonl): a and c finished there, and keep their ledgers.
    expect(ops(calls, "retire")).toEqual([[{ rollout_id: "b", attempt: 0 }]]);
    expect(ops(calls, "restore")).toEqual([]);
    // b's fence lifted once retired, and c's owed forget (finished as attempt 1) sent.
    expect(forgotten(calls)).toEqual(["b", "c"]);
    expect(warnings.join("")).toContain("abandoned");
    const log = (await DispatchLog.read(join(dir, "dispatched.jsonl")))!;
    expect(log.runId).not.toBe("run-a");
    expect(log.continuesRun).toBeUndefined();
    expect(log.collection).toEqual({ tasks: join(dir, "tasks-b.jsonl"), out: join(dir, "results-b.jsonl"), rolloutIdPrefix: "" });
    expect(log.latest.size).toBe(0);
    expect(await collector.run()).toMatchObject({ rows: 2, finished: 2, failed: 0, continued: 0, restarted: 0 });
    // B's rows are its own: a runs again (from attempt 0), as does x.
    expect(sent.sort()).toEqual(["a@0", "x@0"]);
    expect(await readFile(a.out, "utf8")).toBe(outBefore);
  });

  it("abandons a collection stopped before any row finished: its --out exists from its first send, so its attempts are known unfinished and retired", async () => {
    // Collection A sends its rows and is stopped (halted, as a SIGKILL would leave it) before any /run replies.
    const { calls, controller } = await coordinator();
    const arrived: string[] = [];
    server = createServer((req) => {
      let data = "";
      req.on("data", (chunk: Buffer) => (data += chunk.toString()));
      req.on("end", () => arrived.push((JSON.parse(data) as EpisodeId).rollout_id)); // never answered
    });
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const hanging = `http://127.0.0.1:${(server.address() as { port: number }).port}/run`;
    const a = later(controller, hanging, { rowIds: ["p", "q"], outPath: join(dir, "results-a.jsonl"), tasksPath: join(dir, "tasks-a.jsonl") });
    await a.start();
    const running = a.run();
    await waitUntil(() => arrived.length === 2, "A's rows sent");
    await a.halt();
    server.closeAllConnections(); // its /runs end (dropped: a halted collector keeps no reply)
    server.close();
    await running.catch(() => undefined);
    // Collection B abandons it.
    const sent: string[] = [];
    const b = later(controller, await runServer(sent), { newCollection: true });
    await b.start();
    // Before: results-a.jsonl was not there (created by the first finished row), so which rows
    // finished was unknown and neither attempt was retired: both kept running at the Gym.
    expect(ops(calls, "retire")).toEqual([[{ rollout_id: "p", attempt: 0 }, { rollout_id: "q", attempt: 0 }]]);
    expect(forgotten(calls)).toEqual(["p", "q"]);
  });

  it("a row the earlier collection finished whose --out line only lost its newline (a crash mid-append) counts as finished: not retired, its ledger kept", async () => {
    const a = await earlierCollection({ out: false });
    await appendResult(a.out, finished("a", 0));
    // c@1's record is whole, its newline lost to the crash: a restart counts it (readResultsForAppend).
    await writeFile(a.out, `${await readFile(a.out, "utf8")}${JSON.stringify(finished("c", 1))}`);
    const outBefore = await readFile(a.out, "utf8");
    const { calls, controller } = await coordinator();
    await later(controller, await runServer([]), { newCollection: true }).start();
    // Before: [b@0, c@1]: c, finished, was retired (its model ledger deleted at the proxy).
    expect(ops(calls, "retire")).toEqual([[{ rollout_id: "b", attempt: 0 }]]);
    expect(forgotten(calls)).toEqual(["b", "c"]);
    // Abandoning writes nothing of the earlier collection's: its --out is not repaired either.
    expect(await readFile(a.out, "utf8")).toBe(outBefore);
  });

  it("a --checkpoint-dir that is not the coordinator's root is refused before the log's rollouts are retired there", async () => {
    await earlierCollection();
    const { calls, controller } = await coordinator();
    // The coordinator's LATEST is not in --checkpoint-dir: the log is another root's, its rollouts
    // (row-1, …: ids collections share) maybe another collection's, live at this coordinator.
    const list = async () => ({ latest: "ckpt-20240103T000000-dddddddd", checkpoints: [] });
    const elsewhere = new Proxy(controller, { get: (target, op) => (op === "list" ? list : Reflect.get(target, op)) });
    const error = await later(elsewhere, await runServer([]), { newCollection: true }).start().then(() => undefined, (e: unknown) => e);
    expect((error as CheckpointError).code).toBe("invalid_request");
    expect((error as CheckpointError).message).toContain("is not the coordinator's checkpoint root");
    // Before: b@0 retired and b, c forgotten at that coordinator, then the start refused.
    expect(calls).toEqual([]);
    expect((await DispatchLog.read(join(dir, "dispatched.jsonl")))!.runId).toBe("run-a");
  });

  it("closes a checkpoint the earlier collection left open before retiring (retires are refused while one is open)", async () => {
    const a = await earlierCollection();
    const left = "ckpt-20240102T000000-bbbbbbbb";
    await new DispatchLogAppender(a.log).checkpoint(left);
    const { calls, controller, state } = await coordinator(undefined, { checkpoint_id: left, phase: "prepared" });
    await later(controller, await runServer([]), { newCollection: true }).start();
    expect(calls.map((c) => c.op)).toEqual(["resume", "retire", "forget"]);
    expect(state.open).toBeNull();
    // Carried: a prepare of the earlier run still waiting at the coordinator may open later.
    expect([...(await DispatchLog.read(a.log))!.checkpoints]).toEqual([left]);
  });

  it("a checkpoint open that the earlier collection did not start is another controller's: refused (checkpoint_conflict), nothing retired", async () => {
    await earlierCollection();
    const { calls, controller } = await coordinator(undefined, { checkpoint_id: "ckpt-20240102T000000-cccccccc", phase: "prepared" });
    const error = await later(controller, await runServer([]), { newCollection: true }).start().then(() => undefined, (e: unknown) => e);
    expect((error as CheckpointError).code).toBe("checkpoint_conflict");
    expect(calls).toEqual([]);
    expect((await DispatchLog.read(join(dir, "dispatched.jsonl")))!.runId).toBe("run-a");
  });

  it.each([
    ["its --out is gone", { out: false }],
    ["its log is older than the header naming its --out", { header: "older" as const }],
  ])("the earlier collection's finished rows cannot be told (%s): only what certainly never finished, an attempt only restored, is retired; the rest is said, not retired", async (_name, earlier) => {
    const a = await earlierCollection(earlier);
    await new DispatchLogAppender(a.log).restored({ rollout_id: "d", attempt: 1 });
    const { calls, controller } = await coordinator();
    const warnings: string[] = [];
    await later(controller, await runServer([]), { newCollection: true, logger: pino({ level: "warn" }, { write: (line: string) => warnings.push(line) }) }).start();
    expect(ops(calls, "retire")).toEqual([[{ rollout_id: "d", attempt: 1 }]]);
    expect(forgotten(calls)).toEqual(["d"]);
    expect(warnings.join("")).toContain("not retired");
    expect((await DispatchLog.read(a.log))!.runId).not.toBe("run-a");
  });

  it("a log that is this very collection's is continued, flag or not: a job script that keeps --new-collection still resumes after a requeue", async () => {
    const tasks = join(dir, "tasks-b.jsonl");
    const out = join(dir, "results-b.jsonl");
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-b", [{ rollout_id: "a", attempt: 0 }], undefined, [], { tasks, out, rolloutIdPrefix: "" });
    const { calls, controller } = await coordinator({ runId: "run-b", continued: [{ rollout_id: "a", attempt: 0 }] });
    const sent: string[] = [];
    const collector = later(controller, await runServer(sent), { newCollection: true, rowIds: ["a"] });
    await collector.start();
    expect(ops(calls, "restore")).toEqual([[{ rollout_id: "a", attempt: 0 }]]);
    expect(await collector.run()).toMatchObject({ finished: 1, continued: 1 });
    expect(sent).toEqual(["a@1"]);
  });
});

/** Lines a dead collector appended to its log after its header. */
class DispatchLogAppender {
  constructor(private readonly path: string) {}
  async checkpoint(checkpointId: string): Promise<void> {
    await writeFile(this.path, `${await readFile(this.path, "utf8")}${JSON.stringify({ checkpoint_id: checkpointId })}\n`);
  }
  async restored(episode: EpisodeId): Promise<void> {
    await writeFile(this.path, `${await readFile(this.path, "utf8")}${JSON.stringify({ ...episode, restored: true })}\n`);
  }
}
