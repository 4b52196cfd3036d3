import { appendFile, mkdir, mkdtemp, readFile, rename, rm, symlink, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import pino from "pino";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Collector, type CollectorController, type CollectorOptions } from "../../../coordinator/collect/collector.js";
import { DispatchLog } from "../../../coordinator/collect/dispatch-log.js";
import type { TaskFile } from "../../../coordinator/collect/task-file.js";
import { TaskLineRef } from "../../../coordinator/collect/task-rows.js";
import { ProgressReporter } from "../../../coordinator/collect/progress-reporter.js";
import { appendResult, readResults } from "../../../coordinator/collect/results-file.js";
import { DEFAULT_RETRY_PAUSES } from "../../../coordinator/collect/retry-pauses.js";
import { EnvironmentKind } from "../../../participants/kinds/environment/index.js";
import { dispatchController } from "../../../coordinator/api/controller-dispatch.js";
import { CheckpointError, canonicalDigest, sha256Hex, type ControllerOp, type CtlReplyOf, type EpisodeId } from "../../../protocol/index.js";
import { closedPort } from "../../support/ports.js";
import { waitUntil } from "../../support/wait-until.js";
import { makeEngine, writeParticipant, writers } from "../coordinator/fake-participants.js";
import { collectorIn } from "../../support/collector-fixture.js";
import { createLogger } from "../../../coordinator/telemetry/logger.js";
import { deferred } from "../../support/deferred.js";
import { delay } from "../../../coordinator/collect/delay.js";

/**
 * The collector against a scripted `/run` server and a fake controller that keeps the engine's
 * rules the collector relies on (one open checkpoint; retire and forget refused while one is open,
 * except a restore; a restore closes the published checkpoint it restores, and a retry of the open
 * restore with the same id and scope gets its reply).
 */
let dir: string;
let server: Server | undefined;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collector-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  server?.closeAllConnections();
  server?.close();
  server = undefined;
  await rm(dir, { recursive: true, force: true });
});

interface RunRequest {
  rollout_id: string;
  attempt: number;
  task: unknown;
}
type RunHandler = (body: RunRequest) => Promise<{ status: number; body: unknown }> | { status: number; body: unknown };

async function runServer(handler: RunHandler): Promise<string> {
  server = createServer((req, res) => {
    let data = "";
    req.on("data", (chunk: Buffer) => (data += chunk.toString()));
    req.on("end", () => {
      void Promise.resolve(handler(JSON.parse(data) as RunRequest)).then((reply) => {
        if (res.destroyed) return;
        res.writeHead(reply.status, { "content-type": "application/json" });
        res.end(JSON.stringify(reply.body));
      });
    });
  });
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server!.address() as { port: number }).port}/run`;
}


type Call = { op: string; req: Record<string, unknown> };

/** A controller that records its calls; `overrides` replace single ops. */
/**
 * A coordinator with nothing open whose participant model/m1 is still parked in checkpoint `id`
 * (`phase`): it refuses every retire with `refusal` until a resume of `id` lets it go (when
 * `releasedByResume`, as the engine resumes the holders of an id it has not open); `status` is
 * answered as `coordinator` (the ready leader by default), `get` as `get` when given.
 */
function parkedParticipantController(options: {
  id: string;
  phase: string;
  refusal: () => CheckpointError;
  releasedByResume?: boolean;
  coordinator?: { id: string; leader: boolean; ready: boolean; epoch: number | null };
  get?: (id: never) => Promise<unknown>;
}) {
  let parked = true;
  const made = fakeController({
    retire: async (req: never) => {
      made.calls.push({ op: "retire", req });
      if (parked) throw options.refusal();
      return { participants: [] };
    },
    status: async () => ({
      coordinator: options.coordinator ?? { id: "c1", leader: true, ready: true, epoch: 1 },
      checkpoint: null,
      participants: parked ? [{ kind: "model", instance: "m1", phase: options.phase, checkpoint_id: options.id }] : [],
    }),
    ...(options.get && { get: options.get }),
    resume: async (req: never) => {
      made.calls.push({ op: "resume", req });
      if (options.releasedByResume && (req as { checkpoint_id: string }).checkpoint_id === options.id) parked = false;
      return { checkpoint_id: options.id, participants: [] };
    },
  });
  return made;
}

function fakeController(overrides: Partial<Record<keyof CollectorController, (req: never) => Promise<unknown>>> = {}) {
  const calls: Call[] = [];
  const state = {
    latest: null as string | null,
    published: {} as Record<string, { file: string; sha256: string }>,
    open: null as { checkpoint_id: string; phase: string } | null,
    /** Live participants still parked in the open checkpoint (they refuse its restore). */
    heldParked: false,
  };
  let restoredScope = "";
  const base = {
    async prepare(req: { checkpoint_id: string }) {
      calls.push({ op: "prepare", req });
      if (state.open) throw new CheckpointError("checkpoint_conflict", `checkpoint ${state.open.checkpoint_id} is open`);
      state.open = { checkpoint_id: req.checkpoint_id, phase: "prepared" };
      return { prepared: true, blockers: [], restarts: [], stopped_at: null };
    },
    async commit(req: { checkpoint_id: string; episode_ids: EpisodeId[] }) {
      calls.push({ op: "commit", req });
      const checkpointDir = join(dir, req.checkpoint_id);
      await mkdir(checkpointDir, { recursive: true });
      return { checkpoint_dir: checkpointDir, participants: [{ kind: "environment", episode_ids: req.episode_ids.map((e) => (e.attempt ? `${e.rollout_id}-a${e.attempt}` : e.rollout_id)) }] };
    },
    async publish(req: { checkpoint_id: string; controller_state: { file: string; sha256: string } }) {
      calls.push({ op: "publish", req });
      state.latest = req.checkpoint_id;
      state.published[req.checkpoint_id] = req.controller_state;
      state.open = { checkpoint_id: req.checkpoint_id, phase: "published" };
      return {};
    },
    async resume(req: { checkpoint_id: string }) {
      calls.push({ op: "resume", req });
      if (state.open?.checkpoint_id === req.checkpoint_id) Object.assign(state, { open: null, heldParked: false });
      return {};
    },
    async restore(req: { checkpoint_id: string; episode_ids: EpisodeId[] }) {
      calls.push({ op: "restore", req });
      const reply = { checkpoint_id: req.checkpoint_id, participants: [] };
      const scope = JSON.stringify(req.episode_ids);
      if (state.open?.phase === "restored" && state.open.checkpoint_id === req.checkpoint_id && restoredScope === scope) return reply;
      // The engine closes the published checkpoint it restores, and opens the restore.
      if (state.open?.phase === "published" && state.heldParked) throw new CheckpointError("invalid_phase", `checkpoint ${state.open.checkpoint_id} is still held parked`);
      if (state.open?.phase === "published" && state.open.checkpoint_id === req.checkpoint_id) state.open = null;
      if (state.open) throw new CheckpointError("invalid_phase", `checkpoint ${state.open.checkpoint_id} is open`);
      state.open = { checkpoint_id: req.checkpoint_id, phase: "restored" };
      restoredScope = scope;
      return reply;
    },
    async retire(req: { episode_ids: EpisodeId[] }) {
      calls.push({ op: "retire", req });
      if (state.open && state.open.phase !== "restored") throw new CheckpointError("invalid_phase", `retire is refused while ${state.open.checkpoint_id} is open`);
      return { participants: [] };
    },
    async forget(req: { rollout_ids: string[] }) {
      calls.push({ op: "forget", req });
      if (state.open && state.open.phase !== "restored") throw new CheckpointError("invalid_phase", `forget is refused while ${state.open.checkpoint_id} is open`);
      return { forgotten: req.rollout_ids };
    },
    async list() {
      return { latest: state.latest, checkpoints: [] };
    },
    async status() {
      const held = state.open && state.heldParked ? [{ kind: "environment", instance: "e1", phase: "committed", checkpoint_id: state.open.checkpoint_id }] : [];
      return { coordinator: { id: "c1", leader: true, ready: true, epoch: 1 }, checkpoint: state.open, participants: held };
    },
    async get(id: string) {
      return { latest: id === state.latest, manifest: { controller_state: state.published[id] } };
    },
  };
  const controller = { ...base, ...overrides } as unknown as CollectorController;
  return { controller, calls, state, base };
}

/** A published checkpoint of `runId` continuing `continued`, as LATEST (left open when `open`). */
async function publishCollection(state: ReturnType<typeof fakeController>["state"], id: string, runId: string, continued: EpisodeId[], open = false): Promise<void> {
  await mkdir(join(dir, id), { recursive: true });
  const text = `${JSON.stringify({ checkpoint_id: id, run_id: runId, created_at: 1, continued, restarted: [] })}\n`;
  await writeFile(join(dir, id, "collection.json"), text);
  state.latest = id;
  state.published[id] = { file: "collection.json", sha256: sha256Hex(text) };
  if (open) state.open = { checkpoint_id: id, phase: "published" };
}

async function latestContinued(state: ReturnType<typeof fakeController>["state"]): Promise<EpisodeId[]> {
  return (JSON.parse(await readFile(join(dir, state.latest!, "collection.json"), "utf8")) as { continued: EpisodeId[] }).continued;
}

/** An environment's committed files naming `rollouts` (attempt 0), and its commit-reply entry with the list left out. */
async function committedOwner(checkpointDir: string, checkpointId: string, rollouts: string[]) {
  const lines = rollouts.map((rollout_id) => JSON.stringify({ episode_id: { rollout_id, attempt: 0 }, task_digest: "0".repeat(64), boundary: null }));
  const entry = await writeParticipant(dirname(checkpointDir), checkpointId, "environment", "e1", lines);
  const keys = [...rollouts].sort();
  return { ...entry, episode_ids: null, episode_count: keys.length, episode_ids_sha256: canonicalDigest(keys) };
}

/**
 * A start after run-2 was killed between its restore's reply and the resume: it had logged a@1 as
 * restored, and its restore of run-1's checkpoint is still open at the coordinator. `sent` collects
 * the attempts /run receives.
 */
async function startedAfterRestoreLogged() {
  const log = await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-2", [{ rollout_id: "a", attempt: 0 }], "run-1");
  await log.recordRestored([{ rollout_id: "a", attempt: 1 }]);
  const fake = fakeController();
  await publishCollection(fake.state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }]);
  fake.state.open = { checkpoint_id: "ckpt-20240101T000000-aaaaaaaa", phase: "restored" };
  const sent: number[] = [];
  const url = await runServer((body) => (sent.push(body.attempt), { status: 200, body: { reward: 1 } }));
  const collector = collectorFor(fake.controller, url);
  await collector.start();
  return { ...fake, sent, collector };
}

const restores = (calls: Call[]) => calls.filter((c) => c.op === "restore").map((c) => c.req.episode_ids);

const logger = pino({ level: "silent" });

/** Puts a directory where --out is (the collection made it before its first /run): appends to it fail, EISDIR. */
async function unappendable(out: string): Promise<void> {
  await rm(out, { force: true });
  await mkdir(out);
}

/** A logger whose lines (parsed) land in `lines`. */
function capturingLogger() {
  const lines: { msg: string; level: number }[] = [];
  const log = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as { msg: string; level: number }) });
  return { log, lines };
}

/** The pauses before sending again, a tenth of the defaults' (the order of events, not their pace, is under test). */
const SHORT_PAUSES = { resendS: 0.1, unresumedS: 0.5, retireS: 0.1, unreachableS: 0.1, unreachableMaxS: 0.2, storageS: 0.1, admissionClosedS: 0.05, admissionClosedMaxS: 0.2 };

function collectorFor(controller: CollectorController, runUrl: string, options: Partial<CollectorOptions> = {}): Collector {
  return collectorIn(dir, runUrl, controller, { logger, retryPauses: SHORT_PAUSES, ...options });
}

/**
 * A started collector whose row "a" is running: its `/run` has reached the environment and parks
 * there until the controller's resume (as an exported episode does). `overrides` may replace
 * other ops; resume keeps this hook and then does what the fake does. The first `lost.resumes`
 * resumes fail with `lost.code` instead (they never reached a leader: nothing resumed; a successor
 * keeps a published checkpoint open for its controller's resume, so only the collector can release it).
 */
async function runningUntilResume(overrides: Parameters<typeof fakeController>[0] = {}, lost: { resumes: number; code: "outcome_unknown" | "not_leader" } = { resumes: 0, code: "outcome_unknown" }) {
  const resumed = deferred();
  let arrived = false;
  const url = await runServer(async () => {
    arrived = true;
    await resumed.promise;
    return { status: 200, body: { reward: 1 } };
  });
  const sent = { resumes: 0 };
  const fake = fakeController({
    ...overrides,
    resume: async (req: never) => {
      if (sent.resumes++ < lost.resumes) throw new CheckpointError(lost.code, `no answer on ctl.resume (${lost.code})`);
      resumed.resolve();
      return fake.base.resume(req);
    },
  });
  const collector = collectorFor(fake.controller, url, { checkpointTimeoutSeconds: 3 });
  await collector.start();
  const run = collector.run();
  await waitUntil(() => arrived, "the /run of a");
  return { ...fake, collector, run, sent };
}

describe("collector", () => {
  it("closes a checkpoint its predecessor left open even when the coordinator is still busy with it (deadline passed while queued)", async () => {
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    let refused = 0;
    const { controller, calls, state, base } = fakeController({
      resume: async (req: never) => {
        // The predecessor's prepare still held the coordinator's op lock past this resume's deadline.
        if (refused++ === 0) throw new CheckpointError("deadline_exceeded", "deadline_ts is already in the past");
        return base.resume(req);
      },
    });
    // The predecessor logged its checkpoint before the prepare, then died in it.
    await (await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1")).recordCheckpoint("left-by-predecessor");
    state.open = { checkpoint_id: "left-by-predecessor", phase: "prepared" };
    const collector = collectorFor(controller, url);
    await collector.start();
    expect(refused).toBe(2);
    expect(state.open).toBeNull();
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
    expect(calls.filter((c) => c.op === "resume")).toHaveLength(1); // the refused one never reached base
  });

  it("closes a checkpoint its predecessor left open even when a participant does not answer the resume (its Gym process restarting): the start goes on, with a warning", async () => {
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const { controller, state, base } = fakeController({
      // The coordinator closes the checkpoint and names the participant nobody answered for.
      resume: async (req: never) => {
        await base.resume(req);
        throw new CheckpointError("unreachable", "resume failed on 1 participant(s): environment/environment: unreachable");
      },
    });
    await (await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1")).recordCheckpoint("left-by-predecessor");
    state.open = { checkpoint_id: "left-by-predecessor", phase: "preparing" };
    const warnings: { msg: string; checkpoint_id?: string }[] = [];
    const collector = collectorFor(controller, url, { logger: pino({ level: "warn" }, { write: (line: string) => void warnings.push(JSON.parse(line)) }) });
    await collector.start();
    expect(state.open).toBeNull();
    expect(warnings).toEqual([expect.objectContaining({ checkpoint_id: "left-by-predecessor", msg: expect.stringContaining("resume when their lease expires") })]);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
  });

  it.each([
    ["no log at all (a first start)", undefined],
    ["a log naming only other checkpoints", "ckpt-20240101T000000-bbbbbbbb"],
  ])("refuses to start while another controller's checkpoint is open (%s): nothing is resumed, retired or rewritten", async (_what, logged) => {
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const { controller, calls, state } = fakeController();
    const logPath = join(dir, "dispatched.jsonl");
    if (logged) await (await DispatchLog.create(logPath, "run-1", [{ rollout_id: "a", attempt: 0 }])).recordCheckpoint(logged);
    const before = logged ? await readFile(logPath, "utf8") : undefined;
    // Another controller's checkpoint, mid-flight: a resume would abort it under that controller.
    state.open = { checkpoint_id: "ckpt-20240101T000000-aaaaaaaa", phase: "prepared" };
    const collector = collectorFor(controller, url);
    await expect(collector.start()).rejects.toMatchObject({ code: "checkpoint_conflict", message: expect.stringContaining("gym-ckpt resume ckpt-20240101T000000-aaaaaaaa") });
    expect(calls.map((c) => c.op)).toEqual([]);
    expect(state.open).toEqual({ checkpoint_id: "ckpt-20240101T000000-aaaaaaaa", phase: "prepared" });
    expect(logged ? await readFile(logPath, "utf8") : undefined).toBe(before);
  });

  it.each([
    // An operator's `gym-ckpt restore <id>` of an older checkpoint of ours (retained, logged when we took it).
    ["an older checkpoint of ours its log names", "ckpt-20240101T000000-bbbbbbbb", "restored"],
    // An operator's `gym-ckpt restore` (LATEST by default) of the LATEST our logged run published itself:
    // a start of ours restores only the LATEST of the run its log continues (continues_run).
    ["the LATEST the logged run published itself", "ckpt-20240101T000000-cccccccc", "restored"],
    // The same restores caught while they are still being sent (the status answers while the op runs).
    ["an older checkpoint of ours its log names", "ckpt-20240101T000000-bbbbbbbb", "restoring"],
    ["the LATEST the logged run published itself", "ckpt-20240101T000000-cccccccc", "restoring"],
  ])("refuses to start while another controller's restore of %s (%s) is open (%s): nothing is resumed, restored, retired or rewritten", async (_what, restoredId, phase) => {
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const { controller, calls, state } = fakeController();
    const logPath = join(dir, "dispatched.jsonl");
    const log = await DispatchLog.create(logPath, "run-1", [{ rollout_id: "a", attempt: 0 }]);
    await log.recordCheckpoint("ckpt-20240101T000000-bbbbbbbb");
    await log.recordCheckpoint("ckpt-20240101T000000-cccccccc");
    await publishCollection(state, "ckpt-20240101T000000-bbbbbbbb", "run-1", [{ rollout_id: "a", attempt: 0 }]);
    await publishCollection(state, "ckpt-20240101T000000-cccccccc", "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const before = await readFile(logPath, "utf8");
    // Restored by another controller, waiting for that controller's resume.
    state.open = { checkpoint_id: restoredId, phase };
    const collector = collectorFor(controller, url);
    await expect(collector.start()).rejects.toMatchObject({ code: "checkpoint_conflict", message: expect.stringContaining(`gym-ckpt resume ${restoredId}`) });
    expect(calls.map((c) => c.op)).toEqual([]);
    expect(state.open).toEqual({ checkpoint_id: restoredId, phase });
    expect(await readFile(logPath, "utf8")).toBe(before);
  });

  describe("a predecessor's checkpoint whose prepare opens only after the next start read the status (it waited at the coordinator behind another op; status does not wait)", () => {
    const left = "ckpt-20240101T000000-dddddddd";

    it("the start carries its id into its new log, so a start after it closes it instead of refusing itself", async () => {
      const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
      // run-1 logged its checkpoint, sent the prepare and was killed.
      await (await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1")).recordCheckpoint(left);
      const { controller, state } = fakeController();
      await collectorFor(controller, url).start(); // nothing open yet: its log is replaced
      // The prepare opens it now; that start is killed before a checkpoint of its own.
      state.open = { checkpoint_id: left, phase: "prepared" };
      const collector = collectorFor(controller, url);
      await collector.start();
      expect(state.open).toBeNull();
      expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
    });

    it("…also when that start's restore is refused by it and its log is rewritten with the replacements", async () => {
      const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
      // run-1 had a@0 continued by its LATEST, logged a second checkpoint, sent its prepare and was killed.
      const log = await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
      await log.recordCheckpoint(left);
      let opened = false;
      const { controller, state, base } = fakeController({
        restore: async (req: never) => {
          // The prepare opened it meanwhile: the restore is refused, and so is the retire after it.
          if (!opened) state.open = { checkpoint_id: left, phase: "prepared" };
          opened = true;
          return base.restore(req);
        },
      });
      await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }]);
      await expect(collectorFor(controller, url).start()).rejects.toMatchObject({ code: "invalid_phase" });
      const collector = collectorFor(controller, url);
      await collector.start();
      expect(state.open).toBeNull();
      expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
    });
  });

  it("logs each checkpoint's id before its prepare, so a start after a crash mid-checkpoint knows it for its own", async () => {
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const logged: boolean[] = [];
    const { controller, base } = fakeController({
      prepare: async (req: never) => {
        const id = (req as { checkpoint_id: string }).checkpoint_id;
        logged.push((await DispatchLog.read(join(dir, "dispatched.jsonl")))!.checkpoints.has(id));
        return base.prepare(req);
      },
    });
    const collector = collectorFor(controller, url);
    await collector.start();
    expect((await collector.checkpoint({ stop: false })).published).toBe(true);
    expect(logged).toEqual([true]);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
  });

  it("a checkpoint asked for once the collection has ended (SIGUSR1 or SIGTERM during its summary) is skipped: nothing is prepared that the exiting process would leave parked", async () => {
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const { controller, calls, state } = fakeController();
    const collector = collectorFor(controller, url);
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
    calls.length = 0;
    expect(await collector.checkpoint({ stop: false })).toEqual({ published: false, checkpointId: "" });
    expect(await collector.checkpoint({ stop: true })).toEqual({ published: false, checkpointId: "" });
    expect(calls.map((c) => c.op)).toEqual([]);
    expect(state.open).toBeNull();
  });

  it("finishes when the last row fails for good while the retire of its attempt is still running", { timeout: 10_000 }, async () => {
    const url = await runServer(() => ({ status: 500, body: { oops: 1 } }));
    const retireHeld = deferred();
    let retireStarted = false;
    const { controller, calls, base } = fakeController({
      retire: async (req: never) => {
        retireStarted = true;
        await retireHeld.promise;
        return base.retire(req);
      },
    });
    const collector = collectorFor(controller, url, { maxAttempts: 1 });
    await collector.start();
    const run = collector.run();
    await waitUntil(() => retireStarted, "the retire of the failed attempt");
    retireHeld.resolve();
    const summary = await run;
    expect(summary).toMatchObject({ rows: 1, finished: 0, failed: 1 });
    expect(calls.filter((c) => c.op === "retire").map((c) => c.req.episode_ids)).toEqual([[{ rollout_id: "a", attempt: 0 }]]);
  });

  it("cuts a torn last results line off at start, so the next append does not leave it mid-file", async () => {
    const out = join(dir, "results.jsonl");
    await appendResult(out, { rollout_id: "a", attempt: 0, reward: 1, continued: false, finished_at: 1, response: {} });
    await appendFile(out, '{"rollout_id":"b","att'); // crash mid-append
    const url = await runServer(() => ({ status: 200, body: { reward: 0.5 } }));
    const { controller } = fakeController();
    const collector = collectorFor(controller, url, { rows: [{ rolloutId: "a", task: {} }, { rolloutId: "b", task: {} }] });
    await collector.start();
    expect(await collector.run()).toMatchObject({ rows: 2, finished: 2 });
    // The restart after the next crash reads the file.
    const results = await readResults(out);
    expect(Object.fromEntries([...results].map(([id, r]) => [id, r.reward]))).toEqual({ a: 1, b: 0.5 });
  });

  it("the summary's mean reward is over this collection's rows, as its finished count is, not over other rows --out holds", async () => {
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const out = join(dir, "results.jsonl");
    await appendResult(out, { rollout_id: "other-task", attempt: 0, reward: 100, continued: false, finished_at: 1, response: {} });
    const collector = collectorFor(fakeController().controller, url);
    await collector.start();
    expect(await collector.run()).toMatchObject({ rows: 1, finished: 1 });
    expect(await collector.meanReward()).toBe(1);
  });

  it("a --concurrency far above the row count runs as many rows at once as there are (no worker per unit of the flag)", async () => {
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const collector = collectorFor(fakeController().controller, url, { concurrency: 2 ** 32 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ rows: 1, finished: 1 });
  });

  it("keeps a last results record that is whole but lost its newline", async () => {
    const out = join(dir, "results.jsonl");
    await appendResult(out, { rollout_id: "a", attempt: 0, reward: 1, continued: false, finished_at: 1, response: {} });
    await appendResult(out, { rollout_id: "b", attempt: 2, reward: 1, continued: true, finished_at: 1, response: {} });
    const whole = await readFile(out, "utf8");
    await rm(out);
    await appendFile(out, whole.slice(0, -1)); // crashed before the newline
    const runs: string[] = [];
    const url = await runServer((body) => (runs.push(body.rollout_id), { status: 200, body: { reward: 0 } }));
    const { controller } = fakeController();
    const collector = collectorFor(controller, url, { rows: ["a", "b", "c"].map((rolloutId) => ({ rolloutId, task: {} })) });
    await collector.start();
    expect(await collector.run()).toMatchObject({ rows: 3, finished: 3 });
    expect(runs).toEqual(["c"]);
    expect([...(await readResults(out)).keys()]).toEqual(["a", "b", "c"]);
  });

  it("progress after a restart: lines keep coming while a long row runs, and the rate leaves out rows earlier runs finished", async () => {
    const out = join(dir, "results.jsonl");
    for (let i = 0; i < 9; i++) await appendResult(out, { rollout_id: `r${i}`, attempt: 0, reward: 1, continued: false, finished_at: 1, response: {} });
    const release = deferred();
    const url = await runServer(async () => {
      await release.promise;
      return { status: 200, body: { reward: 1 } };
    });
    const lines: string[] = [];
    const sink = { write: (s: string) => lines.push(s), isTTY: false } as unknown as NodeJS.WritableStream;
    const { controller } = fakeController();
    const rows = Array.from({ length: 10 }, (_, i) => ({ rolloutId: `r${i}`, task: {} }));
    const collector = collectorFor(controller, url, { rows, progress: new ProgressReporter(sink, 50) });
    await collector.start();
    const run = collector.run();
    await waitUntil(() => lines.length >= 3, "progress lines while the last row runs");
    expect(lines.every((l) => l.includes("9/10 done, 1 in flight, 0 failed | 0.0 rows/s, ETA ?"))).toBe(true);
    release.resolve();
    expect(await run).toMatchObject({ finished: 10 });
  });

  it("the age of the last checkpoint is on the progress reporter's own clock (one a library caller gave it, Date.now say)", async () => {
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const sink = { write: () => true, isTTY: false } as unknown as NodeJS.WritableStream;
    const reporter = new ProgressReporter(sink, 10_000, Date.now);
    const { controller } = fakeController();
    const collector = collectorFor(controller, url, { progress: reporter });
    await collector.start();
    expect((await collector.checkpoint({ stop: false })).published).toBe(true);
    const line = reporter.format((collector as unknown as { progressSnapshot: () => Parameters<ProgressReporter["format"]>[0] }).progressSnapshot());
    // Before, the collector took the time on performance.now(): decades "ago" on this clock.
    expect(line).toMatch(/checkpoints 1, last [0-9]s ago/);
  });

  it("a second crash before a restored row is sent continues it as attempt + 2", async () => {
    // Run 1 dispatched a@0 and crashed after a checkpoint continuing it.
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const { controller, calls, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));

    const second = collectorFor(controller, url);
    await second.start();
    expect(restores(calls)).toEqual([[{ rollout_id: "a", attempt: 0 }]]);
    // The restore and its resume carry deadlines like every other op (not the client's 90 s default).
    for (const op of ["restore", "resume"]) expect(calls.find((c) => c.op === op)?.req.deadline_ts).toEqual(expect.any(Number));
    // A checkpoint before a is sent again (then everything crashes) continues the restored a@1.
    expect((await second.checkpoint({ stop: false })).published).toBe(true);
    expect(await latestContinued(state)).toEqual([{ rollout_id: "a", attempt: 1 }]);

    calls.length = 0;
    const third = collectorFor(controller, url);
    await third.start();
    expect(restores(calls)).toEqual([[{ rollout_id: "a", attempt: 1 }]]);
    expect(calls.filter((c) => c.op === "retire")).toEqual([]);
    const summary = await third.run();
    expect(summary).toMatchObject({ finished: 1, continued: 1, restarted: 0 });
    expect((await readResults(join(dir, "results.jsonl"))).get("a")).toMatchObject({ attempt: 2, continued: true });
  });

  it("a restored row whose continuation fails runs again from input: results.jsonl and the summary call it restarted, not continued", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const { controller, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const sent: number[] = [];
    // The continuation (a@1) fails at the environment; a@2 runs the task from input.
    const url = await runServer((body) => (sent.push(body.attempt), body.attempt === 1 ? { status: 500, body: { error: "boom" } } : { status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url);
    await collector.start();
    const summary = await collector.run();
    expect(sent).toEqual([1, 2]);
    expect(summary).toMatchObject({ finished: 1, continued: 0, restarted: 1 });
    expect((await readResults(join(dir, "results.jsonl"))).get("a")).toMatchObject({ attempt: 2, continued: false });
  });

  it("a restored continuation refused invalid_request (its task differs from the checkpoint's) runs again from input, not failed for good", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const { controller, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const sent: number[] = [];
    const refusal = { error: { code: "invalid_request", detail: "a-a1 continues a checkpoint recorded for a different task (digest mismatch)" } };
    const url = await runServer((body) => (sent.push(body.attempt), body.attempt === 1 ? { status: 400, body: refusal } : { status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url);
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0, restarted: 1 });
    expect(sent).toEqual([1, 2]);
  });

  it("sends the rows a restore continues before any row never sent: waiting, they are in every checkpoint's scope beside the rows in flight", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "c", attempt: 0 }]);
    const { controller, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "c", attempt: 0 }]);
    const sent: string[] = [];
    const url = await runServer((body) => (sent.push(`${body.rollout_id}@${body.attempt}`), { status: 200, body: { reward: 1 } }));
    const rows = ["a", "b", "c"].map((rolloutId) => ({ rolloutId, task: {} }));
    const collector = collectorFor(controller, url, { rows, concurrency: 1 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 3, continued: 1 });
    expect(sent).toEqual(["c@1", "a@0", "b@0"]);
  });

  it("a crash right after the restore fences the source attempt and sends the restored one", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const { controller, calls, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const sent: number[] = [];
    const url = await runServer((body) => (sent.push(body.attempt), { status: 200, body: { reward: 1 } }));
    await collectorFor(controller, url).start(); // then dies before sending a@1

    // LATEST is not the logged run's: nothing is restored. a@1 never ran, so a@0 is fenced and a@1
    // is sent (a participant still holding the restored record continues it).
    calls.length = 0;
    const next = collectorFor(controller, url);
    await next.start();
    expect(restores(calls)).toEqual([]);
    expect(calls.filter((c) => c.op === "retire").map((c) => c.req.episode_ids)).toEqual([[{ rollout_id: "a", attempt: 0 }]]);
    await next.run();
    expect(sent).toEqual([1]);
  });

  it("closes its open stop checkpoint with an empty restore when no row continues from it", async () => {
    // SIGTERM with nothing in flight: the stop checkpoint continues nothing and stays open.
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1");
    const { controller, calls, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [], true);
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url);
    await collector.start();
    expect(restores(calls)).toEqual([[]]);
    expect(state.open).toBeNull();
    expect((await collector.checkpoint({ stop: false })).published).toBe(true);
    expect(await collector.run()).toMatchObject({ finished: 1 });
  });

  it("restores its open stop checkpoint before retiring the rows it does not continue", async () => {
    // a@0 was in flight but some server could not capture it: restarted, not continued.
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const { controller, calls, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [], true);
    const sent: number[] = [];
    const url = await runServer((body) => (sent.push(body.attempt), { status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url);
    await collector.start();
    expect(calls.filter((c) => c.op === "restore" || c.op === "retire").map((c) => [c.op, c.req.episode_ids])).toEqual([
      ["restore", []],
      ["retire", [{ rollout_id: "a", attempt: 0 }]],
    ]);
    expect(await collector.run()).toMatchObject({ finished: 1, restarted: 1 });
    expect(sent).toEqual([1]);
  });

  it("resumes its published checkpoint that live Gym processes still hold parked (killed before its resume) and restarts its rows from input", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const { controller, calls, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }], true);
    state.heldParked = true;
    const sent: number[] = [];
    const url = await runServer((body) => (sent.push(body.attempt), { status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url);
    await collector.start();
    expect(calls.filter((c) => ["restore", "resume", "retire"].includes(c.op)).map((c) => [c.op, c.req.episode_ids ?? c.req.checkpoint_id])).toEqual([
      ["resume", "ckpt-20240101T000000-aaaaaaaa"],
      ["retire", [{ rollout_id: "a", attempt: 0 }]],
    ]);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0, restarted: 1, continued: 0 });
    expect(sent).toEqual([1]);
  });

  it("resumes its LATEST, closed at the coordinator, that a live process whose resume failed still holds parked, and restarts its rows from input (no restore: it would be refused invalid_phase)", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const id = "ckpt-20240101T000000-aaaaaaaa";
    let parked = true; // e1's resume failed (the checkpoint op's resume_failures); the coordinator closed the checkpoint
    const { controller, calls, state, base } = fakeController({
      status: async () => ({ checkpoint: null, participants: parked ? [{ kind: "environment", instance: "e1", phase: "committed", checkpoint_id: id }] : [] }),
      restore: async (req: never) => {
        if (parked) {
          calls.push({ op: "restore", req });
          throw new CheckpointError("invalid_phase", `checkpoint ${id} is published but environment/e1 still hold it parked; resume it before a restore`);
        }
        return base.restore(req);
      },
      resume: async (req: never) => {
        parked = false;
        return base.resume(req);
      },
      retire: async (req: never) => {
        if (parked) {
          calls.push({ op: "retire", req });
          throw new CheckpointError("invalid_phase", `retire is refused while checkpoint ${id} is open (committed); resume first`);
        }
        return base.retire(req);
      },
    });
    await publishCollection(state, id, "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const sent: number[] = [];
    const url = await runServer((body) => (sent.push(body.attempt), { status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url);
    await collector.start();
    expect(calls.filter((c) => ["restore", "resume", "retire"].includes(c.op)).map((c) => [c.op, c.req.episode_ids ?? c.req.checkpoint_id])).toEqual([
      ["resume", id],
      ["retire", [{ rollout_id: "a", attempt: 0 }]],
    ]);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0, restarted: 1, continued: 0 });
    expect(sent).toEqual([1]);
  });

  it("a restore left open whose processes restarted since is closed by its resume's clean-up (restore_failed) and the start goes on", async () => {
    // run-2 restored run-1's stop checkpoint (continuing nothing) and died before its resume.
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-2", [{ rollout_id: "a", attempt: 0 }], "run-1");
    const { controller, calls, state } = fakeController({
      resume: async () => {
        // The coordinator retires attempt+1 where the restore may be installed, resumes everyone and closes it.
        state.open = null;
        throw new CheckpointError("restore_failed", "environment/e1 restarted since the restore and lost what it restored");
      },
    });
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", []);
    state.open = { checkpoint_id: "ckpt-20240101T000000-aaaaaaaa", phase: "restored" };
    const sent: number[] = [];
    const url = await runServer((body) => (sent.push(body.attempt), { status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url);
    await collector.start();
    expect(calls.filter((c) => c.op === "retire").map((c) => c.req.episode_ids)).toEqual([[{ rollout_id: "a", attempt: 0 }]]);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0, restarted: 1 });
    expect(sent).toEqual([1]);
  });

  it("an attempt /run refuses as fenced (stale_attempt) never started: the next one is logged and sent without spending an attempt", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const sent: number[] = [];
    // A restore's clean-up fenced a@1 at the coordinator; this start retires a@0 and sends a@1.
    const url = await runServer((body) => (sent.push(body.attempt), body.attempt === 1 ? { status: 409, body: { error: { code: "stale_attempt", detail: "fenced" } } } : { status: 200, body: { reward: 1 } }));
    const { controller, calls } = fakeController();
    const collector = collectorFor(controller, url, { maxAttempts: 1 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
    expect(sent).toEqual([1, 2]);
    expect((await DispatchLog.read(join(dir, "dispatched.jsonl")))!.latest.get("a")).toBe(2);
    expect(calls.filter((c) => c.op === "forget").map((c) => c.req.rollout_ids)).toEqual([["a"]]);
  });

  it("an attempt /run refuses with storage_error (the Gym's disk): retired, and the next one sent after a pause without spending an attempt", async () => {
    const sent: number[] = [];
    const storage = { status: 507, body: { error: { code: "storage_error", detail: "activate: policy: the capture ledger cannot be written (ENOSPC)" } } };
    const url = await runServer((body) => (sent.push(body.attempt), body.attempt < 3 ? storage : { status: 200, body: { reward: 1 } }));
    const { controller, calls } = fakeController();
    const { log, lines } = capturingLogger();
    const collector = collectorFor(controller, url, { maxAttempts: 1, logger: log });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
    expect(sent).toEqual([0, 1, 2, 3]);
    // Each refused attempt may have run part way: retired before the next is sent.
    expect(calls.filter((c) => c.op === "retire").map((c) => c.req.episode_ids)).toEqual([0, 1, 2].map((attempt) => [{ rollout_id: "a", attempt }]));
    // One warning for the spell, one line when /run answers without it again.
    expect(lines.filter((l) => l.level === 40 && String(l.msg).includes("storage_error"))).toHaveLength(1);
    expect(lines.filter((l) => l.level === 30 && String(l.msg).includes("storage_error"))).toHaveLength(1);
    expect((await readResults(join(dir, "results.jsonl"))).get("a")).toMatchObject({ attempt: 3 });
  });

  it("a row /run refuses with storage_error waits alone: the other rows go on being sent", async () => {
    const sent: string[] = [];
    const url = await runServer((body) => (sent.push(`${body.rollout_id}:${body.attempt}`), body.rollout_id === "a" ? { status: 507, body: { error: { code: "storage_error", detail: "ENOENT: no such file, open '/data/a.bin'" } } } : { status: 200, body: { reward: 1 } }));
    const { controller } = fakeController();
    const rows = ["a", "b", "c", "d"].map((rolloutId) => ({ rolloutId, task: {} }));
    const { log, lines } = capturingLogger();
    const collector = collectorFor(controller, url, { rows, concurrency: 2, logger: log, retryPauses: { ...SHORT_PAUSES, storageS: 60 } });
    await collector.start();
    const run = collector.run();
    // Before: the refusal held every send for storageS, so b, c and d waited a minute behind a's.
    await waitUntil(() => ["b:0", "c:0", "d:0"].every((s) => sent.includes(s)), "the other rows sent", 10_000);
    expect(sent.filter((s) => s.startsWith("a:"))).toEqual(["a:0"]);
    // The other rows' replies do not end a's spell: no warn/info pair with every pause.
    await waitUntil(async () => (await readFile(join(dir, "results.jsonl"), "utf8").catch(() => "")).split("\n").filter(Boolean).length === 3, "b, c and d finished", 10_000);
    expect(lines.filter((l) => l.msg.includes("storage_error")).map((l) => l.level)).toEqual([40]);
    await collector.halt();
    await run;
  });

  it("a row's storage_error spell ends with an attempt that failed without a reply: a refusal later starts a new one", async () => {
    const sent: number[] = [];
    const storage = { status: 507, body: { error: { code: "storage_error", detail: "ENOSPC" } } };
    // A refusal, a counted failure without a reply (a timeout), then a refusal again: the spell before the timeout does not count toward --run-timeout-s.
    const url = await runServer((body) => (sent.push(body.attempt), body.attempt === 1 ? new Promise<never>(() => undefined) : body.attempt < 3 ? storage : { status: 200, body: { reward: 1 } }));
    const { controller } = fakeController();
    // Attempt 2 is refused more than --run-timeout-s after attempt 0 was (the pause alone is longer).
    const collector = collectorFor(controller, url, { maxAttempts: 2, runTimeoutSeconds: 0.25, retryPauses: { ...SHORT_PAUSES, storageS: 0.3 } });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
    expect(sent).toEqual([0, 1, 2, 3]);
  });

  it("a row /run keeps refusing with storage_error for --run-timeout-s: its attempts count again, so the collection ends", async () => {
    const sent: number[] = [];
    const url = await runServer((body) => (sent.push(body.attempt), { status: 507, body: { error: { code: "storage_error", detail: "ENOSPC" } } }));
    const { controller } = fakeController();
    const collector = collectorFor(controller, url, { maxAttempts: 2, runTimeoutSeconds: 0.3 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 0, failed: 1 });
    // Uncounted while the spell is younger than 0.3 s (pauses of 0.1 s), then two counted attempts.
    expect(sent.length).toBeGreaterThanOrEqual(3);
    expect(sent).toEqual(sent.map((_, i) => i));
  });

  it("a server that fences every attempt: the row fails after a bounded number of skipped attempts", async () => {
    const sent: number[] = [];
    const url = await runServer((body) => (sent.push(body.attempt), { status: 409, body: { error: { code: "stale_attempt", detail: "fenced" } } }));
    const { controller } = fakeController();
    const collector = collectorFor(controller, url, { maxAttempts: 1 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 0, failed: 1 });
    expect(sent).toEqual([0, 1, 2, 3]);
  });

  it("a start killed before its restore of the previous run's checkpoint landed: the next start, finding it still open, restores it", async () => {
    // run-2 started from run-1's stop checkpoint, wrote its log and died with the restore unsent.
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-2", [{ rollout_id: "a", attempt: 0 }], "run-1");
    const { controller, calls, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }], true);
    const sent: number[] = [];
    const url = await runServer((body) => (sent.push(body.attempt), { status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url);
    await collector.start();
    expect(restores(calls)).toEqual([[{ rollout_id: "a", attempt: 0 }]]);
    expect((await DispatchLog.read(join(dir, "dispatched.jsonl")))!.continuesRun).toBe("run-1");
    expect(await collector.run()).toMatchObject({ finished: 1, continued: 1, restarted: 0 });
    expect(sent).toEqual([1]);
  });

  it("a start killed between its restore's reply and the resume: the next start resumes that restore and sends the restored attempt", async () => {
    const { calls, sent, collector } = await startedAfterRestoreLogged();
    expect(calls.filter((c) => ["restore", "resume", "retire"].includes(c.op)).map((c) => [c.op, c.req.episode_ids ?? c.req.checkpoint_id])).toEqual([
      ["resume", "ckpt-20240101T000000-aaaaaaaa"],
      ["retire", [{ rollout_id: "a", attempt: 0 }]],
    ]);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
    expect(sent).toEqual([1]);
  });

  it("a start killed between its restore's reply and the resume: the restored attempt the next start sends is still a continuation, kept in the scope of a checkpoint taken before it is sent", async () => {
    const { state, sent, collector } = await startedAfterRestoreLogged();
    // Left out of the scope, the environment would drop the restored record it still holds (restored
    // state outside the scope is deleted at commit), and a crash after would restart a from input.
    expect((await collector.checkpoint({ stop: false })).published).toBe(true);
    expect(await latestContinued(state)).toEqual([{ rollout_id: "a", attempt: 1 }]);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0, continued: 1, restarted: 0 });
    expect(sent).toEqual([1]);
    expect((await readResults(join(dir, "results.jsonl"))).get("a")).toMatchObject({ attempt: 1, continued: true });
  });

  it("a start killed while logging its restored attempts (only some written): the next start resumes that restore and sends them all as continuations, not a smaller restore the open one refuses", async () => {
    const log = await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-2", [{ rollout_id: "a", attempt: 0 }, { rollout_id: "b", attempt: 0 }], "run-1");
    await log.recordRestored([{ rollout_id: "a", attempt: 1 }]); // b's line was in a later write the kill cut off
    const { controller, calls, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }, { rollout_id: "b", attempt: 0 }]);
    state.open = { checkpoint_id: "ckpt-20240101T000000-aaaaaaaa", phase: "restored" };
    const sent: string[] = [];
    const url = await runServer((body) => (sent.push(`${body.rollout_id}@${body.attempt}`), { status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url, { rows: [{ rolloutId: "a", task: {} }, { rolloutId: "b", task: {} }] });
    await collector.start();
    expect(restores(calls)).toEqual([]);
    expect(state.open).toBeNull(); // resumed: not left parked until the participants' lease
    expect(await collector.run()).toMatchObject({ finished: 2, failed: 0, continued: 2, restarted: 0 });
    expect(sent.sort()).toEqual(["a@1", "b@1"]);
  });

  it("a restored attempt whose restore left open had failed (its clean-up fenced it) is not counted as a continuation nor kept in a checkpoint's scope", async () => {
    const log = await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-2", [{ rollout_id: "a", attempt: 0 }], "run-1");
    await log.recordRestored([{ rollout_id: "a", attempt: 1 }]);
    const { controller, state } = fakeController({
      resume: async () => {
        state.open = null;
        throw new CheckpointError("restore_failed", "environment/e1 restarted since the restore and lost what it restored");
      },
    });
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }]);
    state.open = { checkpoint_id: "ckpt-20240101T000000-aaaaaaaa", phase: "restored" };
    const sent: number[] = [];
    const url = await runServer((body) => (sent.push(body.attempt), body.attempt === 1 ? { status: 409, body: { error: { code: "stale_attempt", detail: "fenced" } } } : { status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url);
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0, continued: 0, restarted: 1 });
    expect(sent).toEqual([1, 2]);
  });

  it("attempts logged for rollouts --tasks no longer names are retired (a restored one at its restored attempt) with a warning, never restored, and forgotten at the end", async () => {
    // run-2 restored a and b from run-1's checkpoint and resumed it, c was in flight; then it died
    // and the operator removed b and c from the tasks file. The Gym survived: it still holds b@1.
    const log = await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-2", [{ rollout_id: "a", attempt: 0 }, { rollout_id: "b", attempt: 0 }, { rollout_id: "c", attempt: 0 }], "run-1");
    await log.recordRestored([{ rollout_id: "a", attempt: 1 }, { rollout_id: "b", attempt: 1 }]);
    const { controller, calls, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }, { rollout_id: "b", attempt: 0 }]);
    const sent: string[] = [];
    const url = await runServer((body) => (sent.push(`${body.rollout_id}@${body.attempt}`), { status: 200, body: { reward: 1 } }));
    const warnings: string[] = [];
    const collector = collectorFor(controller, url, { logger: pino({ level: "warn" }, { write: (line: string) => warnings.push(line) }) });
    await collector.start();
    expect(restores(calls)).toEqual([]);
    expect(calls.filter((c) => c.op === "retire").map((c) => c.req.episode_ids)).toEqual([
      [
        { rollout_id: "a", attempt: 0 },
        { rollout_id: "b", attempt: 1 },
        { rollout_id: "c", attempt: 0 },
      ],
    ]);
    expect(warnings.join("")).toContain("--tasks no longer has");
    expect(await collector.run()).toMatchObject({ rows: 1, finished: 1, failed: 0, continued: 1 });
    expect(sent).toEqual(["a@1"]);
    expect(calls.filter((c) => c.op === "forget").flatMap((c) => c.req.rollout_ids as string[]).sort()).toEqual(["a", "b", "c"]);
  });

  it("a restore left open whose scope names a rollout --tasks no longer has is resumed, not sent again with a smaller scope (which the open one refuses), and that rollout's restored attempt is retired", async () => {
    // run-2 died before its restore's reply (nothing logged as restored); b was removed since.
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-2", [{ rollout_id: "a", attempt: 0 }, { rollout_id: "b", attempt: 0 }], "run-1");
    const { controller, calls, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }, { rollout_id: "b", attempt: 0 }]);
    state.open = { checkpoint_id: "ckpt-20240101T000000-aaaaaaaa", phase: "restored" };
    const sent: string[] = [];
    const url = await runServer((body) => (sent.push(`${body.rollout_id}@${body.attempt}`), { status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url);
    await collector.start();
    expect(restores(calls)).toEqual([]);
    expect(state.open).toBeNull(); // resumed: not left parked until the participants' lease
    expect(calls.filter((c) => c.op === "retire").map((c) => c.req.episode_ids)).toEqual([
      [
        { rollout_id: "a", attempt: 0 },
        { rollout_id: "b", attempt: 1 },
      ],
    ]);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0, continued: 1, restarted: 0 });
    expect(sent).toEqual(["a@1"]);
  });

  it("its open stop checkpoint is restored without a rollout --tasks no longer has, which is retired after the restore and carried in the log until then", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }, { rollout_id: "b", attempt: 0 }]);
    const { controller, calls, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }, { rollout_id: "b", attempt: 0 }], true);
    let logged: Map<string, number> | undefined;
    const collector = collectorFor({ ...controller, restore: async (req: never) => ((logged = (await DispatchLog.read(join(dir, "dispatched.jsonl")))!.latest), controller.restore(req)) } as CollectorController, await runServer(() => ({ status: 200, body: { reward: 1 } })));
    await collector.start();
    expect(Object.fromEntries(logged!)).toEqual({ a: 0, b: 0 });
    expect(calls.filter((c) => c.op === "restore" || c.op === "retire").map((c) => [c.op, c.req.episode_ids])).toEqual([
      ["restore", [{ rollout_id: "a", attempt: 0 }]],
      ["retire", [{ rollout_id: "b", attempt: 0 }]],
    ]);
    expect(await collector.run()).toMatchObject({ finished: 1, continued: 1 });
  });

  it("sends a timed-out row again only once the retire of the old attempt has stopped it", async () => {
    // The environment keeps running a /run the collector gave up on, and refuses any other attempt
    // of that rollout (stale_attempt) until a retire has stopped it.
    const kind = new EnvironmentKind();
    const seen: string[] = [];
    const bArrived = deferred();
    const url = await runServer(async (body) => {
      if (body.rollout_id === "b") bArrived.resolve();
      try {
        const reply = await kind.begin({ rollout_id: body.rollout_id, attempt: body.attempt }, body.task, {}, async (episode) => {
          if (episode.id.rollout_id === "a" && episode.id.attempt === 0) await new Promise((_, reject) => episode.signal.addEventListener("abort", () => reject(episode.signal.reason as Error)));
          return { reward: 1 };
        });
        seen.push(`${body.rollout_id}@${body.attempt}:ok`);
        return { status: 200, body: reply };
      } catch (error) {
        const code = (error as CheckpointError).code;
        seen.push(`${body.rollout_id}@${body.attempt}:${code}`);
        return { status: 409, body: { error: { code, detail: String(error) } } };
      }
    });
    const { controller } = fakeController({
      // Fault injection: the retire reaches the server only once the collector's one worker has
      // sent its next row after a's /run timed out: a row sent again before its retire finished
      // (failed rows go ahead of rows never sent) would have been sent by then, instead of b.
      retire: async (req: never) => {
        await bArrived.promise;
        await kind.retire((req as { episode_ids: EpisodeId[] }).episode_ids);
        return { participants: [] };
      },
    });
    const rows = ["a", "b"].map((rolloutId) => ({ rolloutId, task: {} }));
    const collector = collectorFor(controller, url, { rows, concurrency: 1, runTimeoutSeconds: 0.3, maxAttempts: 2 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 2, failed: 0 });
    expect(seen).toEqual(["b@0:ok", "a@0:stale_attempt", "a@1:ok"]);
  });

  it("a 2xx /run reply without a numeric reward fails its attempt instead of being recorded as reward 0", async () => {
    const sent: number[] = [];
    const url = await runServer((body) => (sent.push(body.attempt), { status: 200, body: body.attempt === 0 ? { answer: "42" } : { reward: "1" } }));
    const { controller } = fakeController();
    const collector = collectorFor(controller, url, { maxAttempts: 2 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 0, failed: 1 });
    expect(sent).toEqual([0, 1]);
    expect((await readResults(join(dir, "results.jsonl"))).size).toBe(0);
  });

  it("a task /run refuses invalid_request fails its row at once (every attempt would be refused alike), and the summary says why", async () => {
    const sent: string[] = [];
    const refusal = { error: { code: "invalid_request", detail: "tool_rounds: Too big: expected number to be <=8" } };
    const url = await runServer((body) => (sent.push(`${body.rollout_id}@${body.attempt}`), body.rollout_id === "bad" ? { status: 400, body: refusal } : { status: 200, body: { reward: 1 } }));
    const { controller } = fakeController();
    const rows = [{ rolloutId: "bad", task: {} }, { rolloutId: "good", task: {} }];
    const collector = collectorFor(controller, url, { maxAttempts: 3, rows, concurrency: 1 });
    await collector.start();
    expect(await collector.run()).toMatchObject({
      finished: 1,
      failed: 1,
      failedRows: [{ rollout_id: "bad", reason: "/run refused the task: invalid_request: tool_rounds: Too big: expected number to be <=8" }],
    });
    expect(sent).toEqual(["bad@0", "good@0"]);
  });

  it("the summary names why each row failed for good: its last attempt's failure", async () => {
    const url = await runServer(() => ({ status: 500, body: { error: "boom" } }));
    const { controller } = fakeController();
    const collector = collectorFor(controller, url, { maxAttempts: 2 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ failed: 1, failedRows: [{ rollout_id: expect.any(String), reason: '/run answered 500: {"error":"boom"}' }] });
  });

  it("retries a failed retire while a row waits for it", async () => {
    const sent: number[] = [];
    const url = await runServer((body) => (sent.push(body.attempt), body.attempt === 0 ? { status: 500, body: {} } : { status: 200, body: { reward: 1 } }));
    let retires = 0;
    const { controller, base } = fakeController({
      retire: async (req: never) => {
        if (++retires === 1) throw new CheckpointError("deadline_exceeded", "retire timed out");
        return base.retire(req);
      },
    });
    const collector = collectorFor(controller, url, { maxAttempts: 2 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
    expect(sent).toEqual([0, 1]);
    expect(retires).toBe(2);
  });

  it("a row whose retire keeps failing (Gym servers down) fails once --run-timeout-s has passed, and the collection ends", { timeout: 10_000 }, async () => {
    const url = await runServer(() => ({ status: 502, body: {} }));
    let retires = 0;
    const { controller } = fakeController({
      retire: async () => {
        retires++;
        throw new CheckpointError("unreachable", "no participant answered");
      },
    });
    // The default retire pause (1 s): how many tries fit in the run timeout is under test.
    const collector = collectorFor(controller, url, { maxAttempts: 3, runTimeoutSeconds: 1.5, retryPauses: DEFAULT_RETRY_PAUSES });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 0, failed: 1 });
    expect(retires).toBeGreaterThanOrEqual(2);
    expect(retires).toBeLessThanOrEqual(4);
  });

  it("a row that fails for good while retires keep failing: the collection still ends with its summary (the next start retires the attempt)", { timeout: 10_000 }, async () => {
    const url = await runServer(() => ({ status: 502, body: {} }));
    const { controller } = fakeController({
      retire: async () => {
        throw new CheckpointError("unreachable", "no participant answered");
      },
    });
    const collector = collectorFor(controller, url, { maxAttempts: 1 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 0, failed: 1 });
    expect((await DispatchLog.read(join(dir, "dispatched.jsonl")))!.latest.get("a")).toBe(0);
  });

  it("a forget that fails at the end (servers down since an earlier retire) does not throw away the summary either", { timeout: 10_000 }, async () => {
    let aRetired = false;
    const url = await runServer(async (body) => {
      if (body.rollout_id === "b") await waitUntil(() => aRetired, "a's retire");
      return { status: 502, body: {} };
    });
    const { controller, base } = fakeController({
      retire: async (req: never) => {
        const ids = (req as { episode_ids: EpisodeId[] }).episode_ids;
        if (ids.some((e) => e.rollout_id === "b")) throw new CheckpointError("unreachable", "no participant answered");
        const reply = await base.retire(req);
        aRetired = true;
        return reply;
      },
      forget: async () => {
        throw new CheckpointError("unreachable", "no participant answered");
      },
    });
    const collector = collectorFor(controller, url, { maxAttempts: 1, concurrency: 1, rows: [{ rolloutId: "a", task: {} }, { rolloutId: "b", task: {} }] });
    await collector.start();
    await expect(collector.run()).resolves.toMatchObject({ finished: 0, failed: 2 });
  });

  it("logs an attempt once however often admission_closed makes it wait", async () => {
    let refusals = 2;
    const url = await runServer(() =>
      refusals-- > 0 ? { status: 503, body: { error: { code: "admission_closed", detail: "a checkpoint is open" } } } : { status: 200, body: { reward: 1 } },
    );
    const { controller } = fakeController();
    const collector = collectorFor(controller, url);
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 1 });
    const lines = (await readFile(join(dir, "dispatched.jsonl"), "utf8")).trim().split("\n").slice(1);
    expect(lines).toEqual([JSON.stringify({ rollout_id: "a", attempt: 0 })]);
  });

  it("says once, with what to do, when admission stays closed by a checkpoint it did not start, and when rows are admitted again", async () => {
    const refusedUntil = Date.now() + 1200;
    const url = await runServer(() =>
      Date.now() < refusedUntil ? { status: 503, body: { error: { code: "admission_closed", detail: "a checkpoint is open" } } } : { status: 200, body: { reward: 1 } },
    );
    const lines: { msg: string; level: number }[] = [];
    const log = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as { msg: string; level: number }) });
    const { controller } = fakeController();
    const collector = collectorFor(controller, url, { logger: log, retryPauses: { ...SHORT_PAUSES, admissionClosedWarnS: 0.5 }, rows: [{ rolloutId: "a", task: {} }, { rolloutId: "b", task: {} }] });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 2 });
    const said = lines.filter((l) => l.msg.startsWith("/run keeps answering admission_closed") || l.msg === "/run admits rows again");
    expect(said.map((l) => [l.level, l.msg.slice(0, 40)])).toEqual([
      [40, "/run keeps answering admission_closed wh"],
      [30, "/run admits rows again"],
    ]);
  });

  it("while another controller's checkpoint keeps admission closed, one row probes it (backing off) and the others are not sent again until a row is admitted", async () => {
    // Closed until three /runs were sent again; each row sent again every quarter second was
    // `--concurrency` requests per interval (40,000 a second at 10,000).
    const seen = new Set<string>();
    const resentWhileClosed: string[] = [];
    let sentAfterOpen = 0;
    const url = await runServer((body) => {
      const again = seen.has(body.rollout_id);
      seen.add(body.rollout_id);
      if (resentWhileClosed.length < 3) {
        if (again) resentWhileClosed.push(body.rollout_id);
        return { status: 503, body: { error: { code: "admission_closed", detail: "a checkpoint is open" } } };
      }
      sentAfterOpen++;
      return { status: 200, body: { reward: 1 } };
    });
    const { controller } = fakeController();
    const rows = Array.from({ length: 20 }, (_, i) => ({ rolloutId: `r${i}`, task: {} }));
    const collector = collectorFor(controller, url, { rows, concurrency: 20, retryPauses: SHORT_PAUSES });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 20, failed: 0 });
    expect(new Set(resentWhileClosed).size).toBe(1);
    expect(sentAfterOpen).toBe(20); // once admitted, every row went once
  });

  it("once admission reopens, the rows waiting for the probe go while the probe's admitted /run still runs (it replies only when its rollout ends)", async () => {
    const seen = new Set<string>();
    let closed = true;
    let resent = 0;
    let admitted = 0;
    let othersCameBeforeTheProbesReply = false;
    const url = await runServer(async (body) => {
      const again = seen.has(body.rollout_id);
      seen.add(body.rollout_id);
      if (closed) {
        if (again && ++resent >= 2) closed = false;
        return { status: 503, body: { error: { code: "admission_closed", detail: "a checkpoint is open" } } };
      }
      // The probe's admitted rollout runs until every other row came (or 5 s): the rows waiting for
      // its reply would only have come after it.
      if (++admitted === 1) othersCameBeforeTheProbesReply = await waitUntil(() => admitted === 10, "the other rows", 5000).then(() => true, () => false);
      return { status: 200, body: { reward: 1 } };
    });
    const { controller } = fakeController();
    const rows = Array.from({ length: 10 }, (_, i) => ({ rolloutId: `r${i}`, task: {} }));
    const collector = collectorFor(controller, url, { rows, concurrency: 10, retryPauses: { ...SHORT_PAUSES, admittedAfterS: 0.2 } });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 10, failed: 0 });
    expect(othersCameBeforeTheProbesReply).toBe(true);
    expect(admitted).toBe(10); // once admitted, every row went once
  });

  it("a row admitted before another controller's checkpoint closed admission, finishing while it is closed, does not send the waiting rows again", async () => {
    const release = deferred();
    const seen = new Set<string>();
    const resentWhileClosed: string[] = [];
    let released = false;
    let probesAfterRelease = 0;
    const url = await runServer(async (body) => {
      if (body.rollout_id === "slow") {
        await release.promise;
        released = true;
        return { status: 200, body: { reward: 1 } };
      }
      const again = seen.has(body.rollout_id);
      seen.add(body.rollout_id);
      // Closed until the probe went twice after slow's reply (a wait no waiting row would sit out).
      if (probesAfterRelease < 2) {
        if (again) resentWhileClosed.push(body.rollout_id);
        if (again && released) probesAfterRelease++;
        return { status: 503, body: { error: { code: "admission_closed", detail: "a checkpoint is open" } } };
      }
      return { status: 200, body: { reward: 1 } };
    });
    const { controller } = fakeController();
    const rows = ["slow", ...Array.from({ length: 9 }, (_, i) => `r${i}`)].map((rolloutId) => ({ rolloutId, task: {} }));
    const collector = collectorFor(controller, url, { rows, concurrency: 10 });
    await collector.start();
    const run = collector.run();
    await waitUntil(() => seen.size === 9, "every other row refused once");
    release.resolve();
    expect(await run).toMatchObject({ finished: 10, failed: 0 });
    expect(new Set(resentWhileClosed).size).toBe(1);
  });

  it("a halt ends the rows waiting for another controller's checkpoint at once, the probe's backoff included", async () => {
    let refused = 0;
    const url = await runServer(() => (refused++, { status: 503, body: { error: { code: "admission_closed", detail: "a checkpoint is open" } } }));
    const { controller } = fakeController();
    const rows = ["a", "b", "c"].map((rolloutId) => ({ rolloutId, task: {} }));
    const collector = collectorFor(controller, url, { rows, concurrency: 3, retryPauses: { ...SHORT_PAUSES, admissionClosedS: 600, admissionClosedMaxS: 600 } });
    await collector.start();
    let ended = false;
    const run = collector.run().finally(() => (ended = true));
    await waitUntil(() => refused === 3, "every row refused once");
    await collector.halt();
    await waitUntil(() => ended, "run() to end", 2000);
    expect(await run).toMatchObject({ finished: 0, failed: 0 });
    expect(refused).toBe(3);
  });

  it("keeps every results line whole when rows with replies larger than one write chunk finish together", async () => {
    // Node writes an append in 512 KiB chunks: unserialized appends of two big lines interleave.
    const arrived = deferred();
    let count = 0;
    const url = await runServer(async (body) => {
      if (++count === 2) arrived.resolve();
      await arrived.promise;
      return { status: 200, body: { reward: 1, transcript: body.rollout_id.repeat(1 << 20) } };
    });
    const { controller } = fakeController();
    const out = join(dir, "results.jsonl");
    const collector = collectorFor(controller, url, { rows: [{ rolloutId: "a", task: {} }, { rolloutId: "b", task: {} }], concurrency: 2 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 2 });
    expect((await readResults(out)).size).toBe(2);
  });

  it("a start-up that fails before sending anything (not yet leader) keeps the checkpoint for the next start", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const { controller, calls, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const notLeader = { ...controller, list: () => Promise.reject(new CheckpointError("not_leader", "not the leader yet")) } as CollectorController;
    await expect(collectorFor(notLeader, url).start()).rejects.toMatchObject({ code: "not_leader" });

    const next = collectorFor(controller, url);
    await next.start();
    expect(restores(calls)).toEqual([[{ rollout_id: "a", attempt: 0 }]]);
  });

  it("a damaged LATEST (list answers latest null with latest_error) refuses the start with its code: not taken for nothing published", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const { controller, calls, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const latestError = { code: "invalid_checkpoint_state" as const, detail: "LATEST does not name a checkpoint id" };
    const damaged = { ...controller, list: async () => ({ latest: null, latest_error: latestError, checkpoints: [] }) } as CollectorController;
    await expect(collectorFor(damaged, url).start()).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("LATEST does not name a checkpoint id") });
    expect(calls.filter((c) => c.op !== "status")).toEqual([]);
  });

  it("refuses LATEST's collection state when it is a symbolic link (as publication does) instead of reading where it points", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const { controller, calls, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const file = join(dir, "ckpt-20240101T000000-aaaaaaaa", "collection.json");
    await rename(file, join(dir, "elsewhere.json"));
    await symlink(join(dir, "elsewhere.json"), file);
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    await expect(collectorFor(controller, url).start()).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("symbolic link") });
    expect(restores(calls)).toEqual([]);
  });

  it("refuses LATEST's collection state whose bytes differ from the published digest even when they decode to the same text", async () => {
    const runId = "run-\uFFFD"; // U+FFFD: what invalid UTF-8 decodes to
    await DispatchLog.create(join(dir, "dispatched.jsonl"), runId, [{ rollout_id: "a", attempt: 0 }]);
    const { controller, calls, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", runId, [{ rollout_id: "a", attempt: 0 }]);
    const file = join(dir, "ckpt-20240101T000000-aaaaaaaa", "collection.json");
    const bytes = await readFile(file);
    const at = bytes.indexOf(Buffer.from("\uFFFD"));
    expect(at).toBeGreaterThan(0);
    // The character's three bytes damaged to one invalid byte: the same text once decoded, another digest.
    await writeFile(file, Buffer.concat([bytes.subarray(0, at), Buffer.from([0xff]), bytes.subarray(at + 3)]));
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    await expect(collectorFor(controller, url).start()).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("does not match its digest") });
    expect(restores(calls)).toEqual([]);
  });

  it("a crash after a failed restore does not send the attempt the coordinator fenced", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const { controller, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }]);
    // The restore fails (the coordinator retires a@1 everywhere); the process dies at the next step.
    const failing = {
      ...controller,
      restore: () => Promise.reject(new CheckpointError("restore_failed", "a participant refused")),
      retire: () => Promise.reject(new Error("killed")),
    } as CollectorController;
    await expect(collectorFor(failing, "http://127.0.0.1:1/run").start()).rejects.toThrow("killed");

    const sent: number[] = [];
    const url = await runServer((body) => {
      sent.push(body.attempt);
      return body.attempt <= 1 ? { status: 409, body: { error: { code: "stale_attempt", detail: "fenced" } } } : { status: 200, body: { reward: 1 } };
    });
    const next = collectorFor(controller, url, { maxAttempts: 1 });
    await next.start();
    expect(await next.run()).toMatchObject({ finished: 1, failed: 0 });
    expect(sent).toEqual([2]);
  });

  // The coordinator's clean-up sends its resume again until its deadline; a participant off NATS
  // past it stays parked in the restore and refuses a retire that does not name it. Before, the
  // collector sent no resume after restore_failed: its retire of attempt+1 was refused
  // checkpoint_conflict there and the start failed, at every start, until that lease expired.
  it("after a restore_failed whose clean-up could not resume a participant, the resume the coordinator sends again there goes before the collector's own retire", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const id = "ckpt-20240101T000000-aaaaaaaa";
    let parked = false;
    const { controller, calls, state } = fakeController({
      restore: async (req: never) => {
        calls.push({ op: "restore", req });
        parked = true;
        throw new CheckpointError("restore_failed", "restore failed on 1 participant(s): environment/e1: storage_error");
      },
      // As the engine answers a resume of a cleaned-up restore: sent again where its resume failed, restore_failed all the same.
      resume: async (req: never) => {
        calls.push({ op: "resume", req });
        if ((req as { checkpoint_id: string }).checkpoint_id === id) parked = false;
        throw new CheckpointError("restore_failed", "the restore was cleaned up");
      },
      retire: async (req: never) => {
        calls.push({ op: "retire", req });
        if (parked) throw new CheckpointError("checkpoint_conflict", `retire failed on 1 participant(s): model/m1: checkpoint_conflict; first details: model/m1: checkpoint ${id} is restored here; retire must name it`);
        return { participants: [] };
      },
    });
    await publishCollection(state, id, "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    await collectorFor(controller, url).start();
    const after = calls.slice(calls.findIndex((c) => c.op === "restore") + 1).filter((c) => c.op === "resume" || c.op === "retire");
    expect(after.map((c) => `${c.op}:${String(c.req.checkpoint_id ?? "")}`)[0]).toBe(`resume:${id}`);
    expect(after.some((c) => c.op === "retire")).toBe(true);
  });

  // A participant still parked in a checkpoint the coordinator no longer has open (an earlier
  // collector's restore or checkpoint whose resume never reached it) refuses every retire that does
  // not name it. Before, only a retire right after restore_failed sent a resume first: this start's
  // retire of the logged attempt failed, and so did the start, until that participant's lease expired.
  it.each([
    ["restored", "checkpoint_conflict", (id: string) => `model/m1: checkpoint ${id} is restored here; retire must name it`],
    ["prepared", "invalid_phase", (id: string) => `model/m1: retire is refused while checkpoint ${id} is open (prepared); resume first`],
  ] as const)("a start's retire refused by a participant still parked in a closed checkpoint (%s: %s) resumes that checkpoint and retires again", async (phase, code, detail) => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const parkedIn = "ckpt-20240101T000000-bbbbbbbb";
    // The coordinator has nothing open; the participant's status names what it holds, and the resume
    // of that id lets it go (as the engine resumes the holders of an id it has not open).
    const { controller, calls } = parkedParticipantController({
      id: parkedIn,
      phase,
      refusal: () => new CheckpointError(code, `retire failed on 1 participant(s): model/m1: ${code}; first details: ${detail(parkedIn)}`),
      releasedByResume: true,
    });
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url);
    await collector.start();
    expect(calls.filter((c) => c.op === "resume" || c.op === "retire").map((c) => `${c.op}:${String(c.req.checkpoint_id ?? "")}`)).toEqual(["retire:", `resume:${parkedIn}`, "retire:"]);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
  });

  // A stop checkpoint is closed by its publish: status shows nothing open while its Gym stays parked
  // for its controller to stop. Not one this collection's log knows: another controller's, whose
  // scheduler's grace period is for stopping it; the resume would wake its rollouts up instead.
  it("a start's retire refused by participants parked in another controller's published stop checkpoint: nothing resumed, the start fails with that refusal", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const othersStop = "ckpt-20240101T000000-dddddddd";
    const { controller, calls } = parkedParticipantController({
      id: othersStop,
      phase: "committed",
      refusal: () => new CheckpointError("invalid_phase", `retire failed on 1 participant(s): model/m1: invalid_phase; first details: model/m1: retire is refused while checkpoint ${othersStop} is open (committed); resume first`),
      get: async (id: never) => ({ latest: true, manifest: { checkpoint_id: id, stop: true, controller_state: null } }),
    });
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    await expect(collectorFor(controller, url).start()).rejects.toMatchObject({ code: "invalid_phase" });
    expect(calls.filter((c) => c.op === "resume")).toEqual([]);
  });

  // Its own log's: the earlier run of this collection (or the collection --new-collection abandons)
  // took it, and nobody else will let its Gym go.
  it("a start's retire refused by participants parked in a published stop checkpoint the log names resumes it and retires again", async () => {
    const log = await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const ownStop = "ckpt-20240101T000000-eeeeeeee";
    await log.recordCheckpoint(ownStop);
    const { controller, calls } = parkedParticipantController({
      id: ownStop,
      phase: "committed",
      refusal: () => new CheckpointError("invalid_phase", `retire failed on 1 participant(s): model/m1: invalid_phase; first details: model/m1: retire is refused while checkpoint ${ownStop} is open (committed); resume first`),
      releasedByResume: true,
      get: async (id: never) => ({ latest: false, manifest: { checkpoint_id: id, stop: true, controller_state: null } }),
    });
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url);
    await collector.start();
    expect(calls.filter((c) => c.op === "resume" || c.op === "retire").map((c) => `${c.op}:${String(c.req.checkpoint_id ?? "")}`)).toEqual(["retire:", `resume:${ownStop}`, "retire:"]);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
  });

  // "Nothing open" is the ready leader's word only: a follower (status over HTTP) or a leader still
  // recovering answers checkpoint null while another controller's checkpoint is open at the leader
  // (prepared between its steps: the coordinator itself refused the retire) or journaled for its
  // recovery. Resuming it would abort that controller's checkpoint.
  it.each([
    ["a follower", { id: "c2", leader: false, ready: false, epoch: null }],
    ["a leader still recovering", { id: "c1", leader: true, ready: false, epoch: 2 }],
  ] as const)("a start's retire refused invalid_phase, the status answered by %s: nothing resumed, the start fails with that refusal", async (_who, coordinator) => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const othersId = "ckpt-20240101T000000-cccccccc";
    const { controller, calls } = parkedParticipantController({
      id: othersId,
      phase: "prepared",
      refusal: () => new CheckpointError("invalid_phase", `checkpoint ${othersId} is prepared; retire is not allowed`),
      coordinator,
    });
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    await expect(collectorFor(controller, url).start()).rejects.toMatchObject({ code: "invalid_phase" });
    expect(calls.filter((c) => c.op === "resume")).toEqual([]);
  });

  it("a start's retire refused checkpoint_conflict while no participant's status shows a checkpoint held: the start fails with that refusal, nothing resumed", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const { controller, calls } = fakeController({
      retire: async (req: never) => {
        calls.push({ op: "retire", req });
        throw new CheckpointError("checkpoint_conflict", "retire failed on 1 participant(s): model/m1: checkpoint_conflict");
      },
    });
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    await expect(collectorFor(controller, url).start()).rejects.toMatchObject({ code: "checkpoint_conflict" });
    expect(calls.filter((c) => c.op === "resume")).toEqual([]);
  });

  it("a restore every participant refused (the surviving Gym already resumed from that checkpoint): nothing was cleaned up, so the collector fences what ran and restarts the rows from input, losing none", async () => {
    // run-1 dispatched a@0 and b@0, published a checkpoint continuing a@0 and resumed it; then only the collector died.
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }, { rollout_id: "b", attempt: 0 }]);
    const { controller, calls, state } = fakeController({
      // The coordinator's answer to a restore refused everywhere: the refusal, nothing retired, resumed or left open.
      restore: async (req: never) => {
        calls.push({ op: "restore", req });
        throw new CheckpointError("stale_checkpoint", "restore failed on 1 participant(s): environment/e1: stale_checkpoint; first details: environment/e1: checkpoint was already resumed");
      },
    });
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }]);
    // The surviving servers still run a@0 and b@0 until a retire fences them.
    const fenced = new Map<string, number>();
    const url = await runServer((body) =>
      body.attempt <= (fenced.get(body.rollout_id) ?? -1) ? { status: 409, body: { error: { code: "stale_attempt", detail: "fenced" } } } : { status: 200, body: { reward: 1 } },
    );
    const retire = controller.retire.bind(controller);
    (controller as { retire: (req: { episode_ids: EpisodeId[] }) => Promise<unknown> }).retire = async (req) => {
      for (const e of req.episode_ids) fenced.set(e.rollout_id, Math.max(fenced.get(e.rollout_id) ?? -1, e.attempt));
      return retire(req as never);
    };
    const lines: Record<string, unknown>[] = [];
    const log = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
    const collector = collectorFor(controller, url, { rows: [{ rolloutId: "a", task: {} }, { rolloutId: "b", task: {} }], maxAttempts: 1, logger: log });
    await collector.start();
    expect(restores(calls)).toEqual([[{ rollout_id: "a", attempt: 0 }]]);
    // The line names the checkpoint whose restore failed (before, only the error's message did, when it happened to).
    expect(lines.find((l) => String(l["msg"]).startsWith("restore failed"))).toMatchObject({ level: 40, checkpoint_id: "ckpt-20240101T000000-aaaaaaaa", rows: 1, err: { code: "stale_checkpoint" } });
    // Both rows' running attempts fenced (a's through attempt+1, which the refusal promises was never installed), nothing resumed.
    expect(fenced).toEqual(new Map([["a", 1], ["b", 0]]));
    expect(calls.filter((c) => c.op === "resume")).toEqual([]);
    expect(state.open).toBeNull();
    expect(await collector.run()).toMatchObject({ finished: 2, failed: 0, continued: 0 });
    const results = await readResults(join(dir, "results.jsonl"));
    expect([...results.values()].map((r) => [r.rollout_id, r.attempt, r.continued]).sort()).toEqual([["a", 2, false], ["b", 1, false]]);
  });

  it("a start-up retire whose outcome is unknown (a leader failover mid-op) is sent again, not taken for a failed start", async () => {
    // As above: the restore refused everywhere, then the retire of attempt+1 lost in a failover.
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const { controller, calls, state } = fakeController({
      restore: async (req: never) => {
        calls.push({ op: "restore", req });
        throw new CheckpointError("stale_checkpoint", "restore failed on 1 participant(s): environment/e1: stale_checkpoint");
      },
    });
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const retire = controller.retire.bind(controller);
    const retires: EpisodeId[][] = [];
    (controller as { retire: (req: { episode_ids: EpisodeId[] }) => Promise<unknown> }).retire = async (req) => {
      retires.push(req.episode_ids);
      if (retires.length === 1) throw new CheckpointError("outcome_unknown", "coordinator c0 stopped leading before it answered (c1 leads now)");
      return retire(req as never);
    };
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url, { maxAttempts: 1 });
    await collector.start();
    expect(retires).toEqual([[{ rollout_id: "a", attempt: 1 }], [{ rollout_id: "a", attempt: 1 }]]);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
  });

  it("a start-up retire a participant is unreachable for (a Gym process restarting as the collector starts) is sent again until it goes, for at most --run-timeout-s", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const retires: EpisodeId[][] = [];
    const { controller } = fakeController({
      retire: async (req: never) => {
        retires.push((req as { episode_ids: EpisodeId[] }).episode_ids);
        if (retires.length <= 2) throw new CheckpointError("unreachable", "retire failed on 1 participant(s): environment/e1: unreachable");
        return { participants: [] };
      },
    });
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url, { maxAttempts: 1 });
    await collector.start();
    expect(retires).toEqual([[{ rollout_id: "a", attempt: 0 }], [{ rollout_id: "a", attempt: 0 }], [{ rollout_id: "a", attempt: 0 }]]);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });

    // One that stays unreachable fails the start once --run-timeout-s has passed.
    const { controller: stuck } = fakeController({
      retire: async () => {
        throw new CheckpointError("unreachable", "retire failed on 1 participant(s): environment/e1: unreachable");
      },
    });
    const other = join(dir, "other");
    await mkdir(other);
    await DispatchLog.create(join(other, "dispatched.jsonl"), "run-2", [{ rollout_id: "a", attempt: 0 }]);
    const begun = Date.now();
    await expect(collectorIn(other, url, stuck, { logger, retryPauses: SHORT_PAUSES, runTimeoutSeconds: 0.3 }).start()).rejects.toMatchObject({ code: "unreachable" });
    expect(Date.now() - begun).toBeGreaterThanOrEqual(300);
  });

  it("a checkpoint does not wait for a row the coordinator restarts (it parks until the resume)", async () => {
    const { collector, run, base } = await runningUntilResume({
      prepare: async (req: never) => ({ ...(await base.prepare(req)), restarts: ["a"] }),
    });
    const started = Date.now();
    expect((await collector.checkpoint({ stop: false })).published).toBe(true);
    expect(Date.now() - started).toBeLessThan(1000);
    expect(await run).toMatchObject({ finished: 1 });
  });

  it("a commit reply that left an owner's episode list out: the collector reads it from the owner's committed records and does not wait for those rows", async () => {
    const { collector, run, state, base } = await runningUntilResume({
      commit: async (req: never) => {
        const reply = await base.commit(req);
        const id = (req as { checkpoint_id: string }).checkpoint_id;
        // As the NATS API answers past 1 MiB: the list null, with its count and digest.
        return { ...reply, checkpoint_id: id, participants: [await committedOwner(reply.checkpoint_dir, id, ["a"])] };
      },
    });
    const started = Date.now();
    expect((await collector.checkpoint({ stop: false })).published).toBe(true);
    expect(Date.now() - started).toBeLessThan(1000);
    expect(await latestContinued(state)).toEqual([{ rollout_id: "a", attempt: 0 }]);
    expect(await run).toMatchObject({ finished: 1 });
  });

  it("refuses a checkpoint whose owner's committed records do not match the left-out list's count and digest", async () => {
    const { collector, run, calls, base } = await runningUntilResume({
      commit: async (req: never) => {
        const reply = await base.commit(req);
        const id = (req as { checkpoint_id: string }).checkpoint_id;
        const owner = await committedOwner(reply.checkpoint_dir, id, ["a"]);
        return { ...reply, checkpoint_id: id, participants: [{ ...owner, episode_count: 2 }] };
      },
    });
    await expect(collector.checkpoint({ stop: false })).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("the commit reply says 2") });
    expect(calls.map((c) => c.op)).not.toContain("publish");
    expect(calls.at(-1)?.op).toBe("resume");
    expect(await run).toMatchObject({ finished: 1 });
  });

  it("a checkpoint's resume answered outcome_unknown (its coordinator died between publish and resume) is sent again, so the parked rows go on", async () => {
    const { state, calls, collector, run } = await runningUntilResume({}, { resumes: 1, code: "outcome_unknown" });
    const { published, checkpointId } = await collector.checkpoint({ stop: false });
    expect(published).toBe(true);
    expect(state.open).toBeNull(); // resumed, not left parked until the participants' lease expires
    expect(calls.filter((c) => c.op === "resume").map((c) => c.req.checkpoint_id)).toEqual([checkpointId]);
    expect(await run).toMatchObject({ finished: 1, failed: 0 });
  });

  it("a published checkpoint whose resume one participant did not answer is a warning saying it resumes when its lease expires, not an error", async () => {
    const lines: { level: number; msg: string; checkpoint_id?: string; published?: boolean }[] = [];
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const fake = fakeController({
      // The coordinator closed the checkpoint and resumed everyone else; e2 did not answer.
      resume: async (req: never) => {
        await fake.base.resume(req);
        throw new CheckpointError("unreachable", "resume failed on 1 participant(s): environment/e2: unreachable; first details: environment/e2: no reply within 5000 ms");
      },
    });
    const collector = collectorFor(fake.controller, url, { logger: pino({ level: "warn" }, { write: (line: string) => void lines.push(JSON.parse(line)) }) });
    await collector.start();
    const { published, checkpointId } = await collector.checkpoint({ stop: false });
    expect(published).toBe(true);
    const resumeLines = lines.filter((l) => l.msg.startsWith("resume failed"));
    expect(resumeLines).toEqual([expect.objectContaining({ level: 40, checkpoint_id: checkpointId, published: true, msg: expect.stringContaining("resume when their lease expires") })]);
    await collector.run();
  });

  it("a checkpoint whose resume stayed unknown through every try is resumed before the next checkpoint's prepare", async () => {
    const { state, calls, collector, run, sent } = await runningUntilResume({}, { resumes: 3, code: "outcome_unknown" });
    const first = await collector.checkpoint({ stop: false });
    expect(first.published).toBe(true);
    expect(state.open).not.toBeNull(); // still published and open: only this collector's resume releases it
    const second = await collector.checkpoint({ stop: false });
    expect(second.published).toBe(true);
    const ops = calls.filter((c) => c.op === "resume" || c.op === "prepare").map((c) => `${c.op} ${c.req.checkpoint_id === first.checkpointId ? "first" : "second"}`);
    // (the fake records the resumes that reached it: the first got through on its fourth send, before the second prepare)
    expect(ops).toEqual(["prepare first", "resume first", "prepare second", "resume second"]);
    expect(sent.resumes).toBe(5);
    expect(state.open).toBeNull();
    expect(await run).toMatchObject({ finished: 1, failed: 0 });
  }, 20_000);

  it("a checkpoint whose resume stayed unknown through every try is sent again in the background, so the parked rows go on without another checkpoint", async () => {
    const { state, collector, run } = await runningUntilResume({}, { resumes: 3, code: "not_leader" });
    expect((await collector.checkpoint({ stop: false })).published).toBe(true);
    expect(state.open).not.toBeNull();
    // No timer, no SIGUSR1: without a resend the Gym stays parked until the participants' lease expires.
    await waitUntil(() => state.open === null, "the checkpoint resumed without another checkpoint", 10_000);
    expect(await run).toMatchObject({ finished: 1, failed: 0, checkpoints: 1 });
  }, 20_000);

  it("a /run reply on the wire that does not arrive within --checkpoint-timeout-s: its row, exported by no owner, is restarted, not continued", async () => {
    const release = deferred();
    let arrived = false;
    const url = await runServer(async () => {
      arrived = true;
      await release.promise; // the episode ended at the environment; its reply is slow to come back
      return { status: 200, body: { reward: 1 } };
    });
    const { controller, state, base } = fakeController({
      commit: async (req: never) => ({ ...(await base.commit(req)), participants: [{ kind: "environment", episode_ids: [] }] }),
    });
    const collector = collectorFor(controller, url, { checkpointTimeoutSeconds: 0.2 });
    await collector.start();
    const run = collector.run();
    await waitUntil(() => arrived, "the /run of a");
    expect((await collector.checkpoint({ stop: false })).published).toBe(true);
    // Continued, a restore would install attempt 1 beside an environment that holds nothing of it.
    const published = JSON.parse(await readFile(join(dir, state.latest!, "collection.json"), "utf8")) as { continued: EpisodeId[]; restarted: EpisodeId[] };
    expect(published.continued).toEqual([]);
    expect(published.restarted).toEqual([{ rollout_id: "a", attempt: 0 }]);
    release.resolve();
    expect(await run).toMatchObject({ finished: 1 });
  });

  it("a /run on the wire that fails during the checkpoint (its episode ended at the environment with an error): its row, exported by no owner, is restarted, not continued", async () => {
    const committed = deferred();
    const sent: number[] = [];
    const url = await runServer(async (body) => {
      sent.push(body.attempt);
      if (sent.length > 1) return { status: 200, body: { reward: 1 } };
      await committed.promise; // the episode ended in an error at the environment; its reply comes back after the commit
      return { status: 500, body: { error: { code: "internal_error", detail: "the episode failed" } } };
    });
    const { controller, state, base } = fakeController({
      commit: async (req: never) => {
        const reply = { ...(await base.commit(req)), participants: [{ kind: "environment", episode_ids: [] }] };
        committed.resolve();
        return reply;
      },
    });
    const collector = collectorFor(controller, url, { checkpointTimeoutSeconds: 5 });
    await collector.start();
    const run = collector.run();
    await waitUntil(() => sent.length === 1, "the /run of a");
    expect((await collector.checkpoint({ stop: false })).published).toBe(true);
    // Continued, a crash now would restore attempt 1 beside an environment that holds nothing of it.
    const published = JSON.parse(await readFile(join(dir, state.latest!, "collection.json"), "utf8")) as { continued: EpisodeId[]; restarted: EpisodeId[] };
    expect(published.continued).toEqual([]);
    expect(published.restarted).toEqual([{ rollout_id: "a", attempt: 0 }]);
    expect(await run).toMatchObject({ finished: 1 });
    expect(sent).toEqual([0, 1]);
  });

  it("a checkpoint does not wait for a row refused admission by that checkpoint, nor continues it", async () => {
    const prepared = deferred();
    const sent: number[] = [];
    const url = await runServer(async (body) => {
      sent.push(body.attempt);
      if (sent.length > 1) return { status: 200, body: { reward: 1 } };
      await prepared.promise; // reached the environment just after prepare closed admission
      return { status: 503, body: { error: { code: "admission_closed", detail: "a checkpoint is open" } } };
    });
    const { controller, state, base } = fakeController({
      prepare: async (req: never) => {
        const reply = await base.prepare(req);
        prepared.resolve();
        return reply;
      },
      commit: async (req: never) => ({ ...(await base.commit(req)), participants: [] }),
    });
    const collector = collectorFor(controller, url, { checkpointTimeoutSeconds: 3 });
    await collector.start();
    const run = collector.run();
    await waitUntil(() => sent.length === 1, "the /run of a");
    const started = Date.now();
    expect((await collector.checkpoint({ stop: false })).published).toBe(true);
    expect(Date.now() - started).toBeLessThan(1000);
    expect(await latestContinued(state)).toEqual([]);
    expect(await run).toMatchObject({ finished: 1 });
    expect(sent).toEqual([0, 0]);
  });
});

describe("collector timer checkpoints", () => {
  /** A controller whose prepare takes `ms` (a slow participant), counting prepares and commits. */
  function slowPrepare(ms: number, overrides: Parameters<typeof fakeController>[0] = {}) {
    const fake = fakeController({
      ...overrides,
      prepare: async (req: never) => {
        await new Promise((resolve) => setTimeout(resolve, ms));
        return fake.base.prepare(req);
      },
    });
    return fake;
  }

  it("skips a tick while a checkpoint runs, so slow checkpoints never pile up behind each other", { timeout: 30_000 }, async () => {
    const url = await runServer(async () => {
      await new Promise((resolve) => setTimeout(resolve, 1000));
      return { status: 200, body: { reward: 1 } };
    });
    const { controller, calls } = slowPrepare(200);
    const rows = ["a", "b"].map((rolloutId) => ({ rolloutId, task: {} }));
    // A tick every 20 ms, a checkpoint every 200 ms: without the skip, 50 would queue in the second the rows run.
    const collector = collectorFor(controller, url, { rows, checkpointEverySeconds: 0.02 });
    await collector.start();
    const asked = vi.spyOn(collector, "checkpoint");
    const started = Date.now();
    expect(await collector.run()).toMatchObject({ finished: 2 });
    expect(Date.now() - started).toBeLessThan(5000); // not held up by a queue of checkpoints (~10 s of them)
    // run() has cleared the timer: the checkpoints asked for until then are all there will be.
    await Promise.allSettled(asked.mock.results.map((r) => r.value));
    expect(calls.filter((c) => c.op === "prepare").length).toBeLessThanOrEqual(7); // at most 1000/200 + 2
  });

  // Before, a failed timer checkpoint logged only `timer checkpoint failed` with the error: which
  // checkpoint id it was (to find in the coordinator's log) was nowhere.
  it("a timer checkpoint that fails is one warning naming its checkpoint_id", { timeout: 20_000 }, async () => {
    let answer!: () => void;
    const answered = new Promise<void>((resolve) => (answer = resolve));
    const url = await runServer(async () => {
      await answered;
      return { status: 200, body: { reward: 1 } };
    });
    const prepared: string[] = [];
    const { controller } = fakeController({
      prepare: async (req: never) => {
        prepared.push((req as { checkpoint_id: string }).checkpoint_id);
        answer();
        throw new CheckpointError("outcome_unknown", "coordinator c0 stopped leading before it answered (c1 leads now); retry the op to learn its outcome");
      },
    });
    const lines: Record<string, unknown>[] = [];
    const log = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
    const collector = collectorFor(controller, url, { checkpointEverySeconds: 0.05, logger: log });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 1 });
    const failed = lines.filter((l) => (l["level"] as number) >= 40 && String(l["msg"]).includes("checkpoint") && (l["err"] as { code?: string } | undefined)?.code === "outcome_unknown");
    expect(failed.length).toBeGreaterThan(0);
    for (const line of failed) expect(prepared).toContain(line["checkpoint_id"]);
    expect(failed.map((l) => l["checkpoint_id"])).toEqual([...new Set(failed.map((l) => l["checkpoint_id"]))]); // one line each
  });

  it("a period past the timer range (30 days) is not a period of 1 ms", async () => {
    const url = await runServer(async () => {
      await new Promise((resolve) => setTimeout(resolve, 300));
      return { status: 200, body: { reward: 1 } };
    });
    const { controller, calls } = fakeController();
    const collector = collectorFor(controller, url, { checkpointEverySeconds: 30 * 24 * 3600 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 1 });
    expect(calls.filter((c) => c.op === "prepare")).toHaveLength(0);
  });

  /**
   * A collection whose first row's failed attempt holds the collector's lock in its retire: a
   * checkpoint asked for meanwhile waits behind it, as does the stop that follows. Checkpoints asked
   * for before the retire holds the lock (a timer tick before a's /run failed) are answered as
   * skipped without running: one that took the lock just before a's /run failed would retire a's
   * attempt itself, holding the lock, which is no checkpoint waiting behind the retire.
   */
  async function heldByARetire(options: { checkpointEverySeconds?: number }) {
    const release = deferred();
    const url = await runServer(async (body) => {
      if (body.rollout_id === "a" && body.attempt === 0) return { status: 500, body: { oops: 1 } };
      await release.promise;
      return { status: 200, body: { reward: 1 } };
    });
    let retireStarted = false;
    const retireHeld = deferred();
    const fake = slowPrepare(0, {
      retire: async (req: never) => {
        retireStarted = true;
        await retireHeld.promise;
        return fake.base.retire(req);
      },
    });
    const rows = ["a", "b"].map((rolloutId) => ({ rolloutId, task: {} }));
    const collector = collectorFor(fake.controller, url, { rows, checkpointTimeoutSeconds: 3, ...options });
    await collector.start();
    // Watched from the start: a timer tick that lands between the retire taking the lock and the
    // test looking (a loaded machine) is still seen; ticks skip while it waits, so none would follow.
    const checkpoint = collector.checkpoint.bind(collector);
    const asked = vi.spyOn(collector, "checkpoint").mockImplementation((request) => (retireStarted ? checkpoint(request) : Promise.resolve({ published: false, checkpointId: "" })));
    const run = collector.run();
    await waitUntil(() => retireStarted, "the retire of a's failed attempt");
    // Nothing was checkpointed before the hold, so every call since the start is one since the hold.
    const callsSinceHold = (op: string) => fake.calls.filter((c) => c.op === op);
    /** Checkpoints asked for and not settled: while the retire holds the lock, those waiting behind it. */
    const waitingCheckpoints = () => asked.mock.settledResults.flatMap((r, i) => (r.type === "incomplete" ? [i] : []));
    return { collector, run, fake, asked, callsSinceHold, waitingCheckpoints, releaseRetire: () => retireHeld.resolve(), releaseRuns: () => release.resolve() };
  }

  it("a stop checkpoint goes ahead of a timer checkpoint still waiting for its turn", { timeout: 30_000 }, async () => {
    const held = await heldByARetire({ checkpointEverySeconds: 0.05 });
    const { asked } = held;
    // A tick while b runs asks for a checkpoint, which waits for the lock the retire holds.
    await waitUntil(() => held.waitingCheckpoints().length > 0, "a timer checkpoint asked for while the retire holds the lock");
    const timerOne = held.waitingCheckpoints();
    expect(timerOne).toHaveLength(1); // one tick: ticks skip while a checkpoint waits
    expect(asked.mock.calls[timerOne[0]!]).toEqual([{ stop: false }]);
    expect(held.callsSinceHold("prepare")).toHaveLength(0);
    const stop = held.collector.checkpoint({ stop: true });
    held.releaseRetire();
    expect((await stop).published).toBe(true);
    await expect(asked.mock.results[timerOne[0]!]!.value).resolves.toEqual({ published: false, checkpointId: "" }); // the timer one, skipped
    // The only checkpoint taken since the retire held the lock is the stop: the timer one that
    // waited gave way, none queued after it.
    expect(held.callsSinceHold("commit").map((c) => c.req.stop)).toEqual([true]);
    held.releaseRuns();
    await held.run;
    // Nothing after the stop either. run() has cleared the timer when it resolves, so a later
    // prepare could only come from a checkpoint asked for and not yet settled: wait for those.
    await Promise.allSettled(asked.mock.results.map((r) => r.value));
    expect(held.callsSinceHold("prepare")).toHaveLength(1);
  });

  it("a stop checkpoint goes ahead of a SIGUSR1 checkpoint still waiting for its turn, which is not run after it", { timeout: 30_000 }, async () => {
    const held = await heldByARetire({});
    const requested = held.collector.checkpoint({ stop: false }); // a SIGUSR1, queued first
    const stop = held.collector.checkpoint({ stop: true });
    held.releaseRetire();
    expect((await stop).published).toBe(true);
    expect(await requested).toEqual({ published: false, checkpointId: "" }); // skipped
    expect(held.fake.calls.filter((c) => c.op === "commit").map((c) => c.req.stop)).toEqual([true]);
    held.releaseRuns();
    await held.run;
    expect(held.fake.calls.filter((c) => c.op === "prepare")).toHaveLength(1);
  });
});

/**
 * A /run server holding every request until the test answers it (`answer`); `dropped` settles once
 * the collector hung up on the /run of `watched` (stopSending aborts the /runs in flight).
 */
async function heldRunServer(watched: string) {
  const requests: string[] = [];
  const answers = new Map<string, (status: number, body: unknown) => void>();
  const dropped = deferred();
  server = createServer((req, res) => {
    let data = "";
    req.on("data", (chunk: Buffer) => (data += chunk.toString()));
    req.on("end", () => {
      const { rollout_id } = JSON.parse(data) as RunRequest;
      requests.push(rollout_id);
      if (rollout_id === watched) res.on("close", () => void (!res.writableFinished && dropped.resolve()));
      answers.set(rollout_id, (status, body) => res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body)));
    });
  });
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(server.address() as { port: number }).port}/run`, requests, answers, dropped };
}

describe("collector failures", () => {
  it("a run that cannot append its results stops dispatching and drops the /runs in flight at once", { timeout: 10_000 }, async () => {
    const out = join(dir, "results.jsonl");
    let dropped = false;
    let answerA: (() => void) | undefined;
    const requests: string[] = [];
    server = createServer((req, res) => {
      let data = "";
      req.on("data", (chunk: Buffer) => (data += chunk.toString()));
      req.on("end", () => {
        const { rollout_id } = JSON.parse(data) as RunRequest;
        requests.push(rollout_id);
        res.on("close", () => void (!res.writableFinished && (dropped = true)));
        // a answers once b is in flight (each dispatch waits for its dispatch-log sync first), so
        // the failure of a's append has a /run to drop; any other row runs until the collector hangs up
        // --out made a directory first: a's append fails (EISDIR), as an append the storage refuses would.
        if (rollout_id === "a") answerA = () => void unappendable(out).then(() => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1 })));
        if (requests.includes("a") && requests.includes("b")) answerA?.();
      });
    });
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}/run`;
    const { controller } = fakeController();
    const rows = ["a", "b", "c", "d"].map((rolloutId) => ({ rolloutId, task: {} }));
    // A worker reports progress once a /run of its has ended: no /run ends before a's fails, so a
    // report is b's worker back from its dropped /run (a's worker fails with the append).
    let reports = 0;
    const progress = { start: () => undefined, update: () => void reports++, finish: () => undefined, now: () => Date.now() } as unknown as ProgressReporter;
    const collector = collectorFor(controller, url, { rows, concurrency: 2, outPath: out, progress });
    await collector.start();
    await expect(collector.run()).rejects.toMatchObject({ code: "EISDIR" });
    // Every worker came back before run() rejected (b's from its dropped /run), so no row was sent
    // after the failure, nor logged to be sent, nor can be any more.
    expect(reports).toBe(1);
    expect(requests.sort()).toEqual(["a", "b"]);
    expect([...(await DispatchLog.read(join(dir, "dispatched.jsonl")))!.latest.keys()].sort()).toEqual(["a", "b"]);
    await waitUntil(() => dropped, "the /run of b to be dropped", 5000);
  });

  it("a run that fails waits at most --run-timeout-s for a worker its storage holds", { timeout: 10_000 }, async () => {
    const out = join(dir, "results.jsonl");
    const url = await runServer(async () => {
      await unappendable(out);
      return { status: 200, body: { reward: 1 } };
    });
    // b's line is read from a tasks file whose read never ends (a dead mount); its close waits for
    // that read, as FileHandle.close does, so the failure cannot wait for the close either.
    const never = new Promise<never>(() => undefined);
    const hung = { path: join(dir, "tasks.jsonl"), read: () => never, close: () => never } as unknown as TaskFile;
    const rows = [
      { rolloutId: "b", task: new TaskLineRef(hung, 1, 0, 2, "") },
      { rolloutId: "a", task: {} },
    ];
    const { log, lines } = capturingLogger();
    const collector = collectorFor(fakeController().controller, url, { rows, concurrency: 2, outPath: out, runTimeoutSeconds: 0.5, logger: log });
    await collector.start();
    await expect(collector.run()).rejects.toMatchObject({ code: "EISDIR" });
    expect(lines.filter((l) => l.msg.startsWith("a worker did not come back")).length).toBe(1);
  });

  it("a run that fails while a row waits for our checkpoint to end rejects once that row's worker is back: nothing is sent after it", { timeout: 10_000 }, async () => {
    const out = join(dir, "results.jsonl");
    const requests: string[] = [];
    const answers = new Map<string, (status: number, body: unknown) => void>();
    let refusalSent = false;
    server = createServer((req, res) => {
      let data = "";
      req.on("data", (chunk: Buffer) => (data += chunk.toString()));
      req.on("end", () => {
        const { rollout_id } = JSON.parse(data) as RunRequest;
        requests.push(rollout_id);
        answers.set(rollout_id, (status, body) => {
          res.on("finish", () => void (rollout_id === "b" && (refusalSent = true)));
          res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body));
        });
      });
    });
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}/run`;
    // Our checkpoint stays open (its prepare unanswered) until the test lets it go on.
    const prepared = deferred();
    let preparing = false;
    const fake = fakeController({
      prepare: async (req: never) => {
        preparing = true;
        await prepared.promise;
        return fake.base.prepare(req);
      },
    });
    let reports = 0;
    const progress = { start: () => undefined, update: () => void reports++, finish: () => undefined, now: () => Date.now() } as unknown as ProgressReporter;
    const rows = ["a", "b", "c"].map((rolloutId) => ({ rolloutId, task: {} }));
    const collector = collectorFor(fake.controller, url, { rows, concurrency: 2, outPath: out, progress });
    await collector.start();
    const run = collector.run();
    await waitUntil(() => answers.has("a") && answers.has("b"), "a and b in flight", 5000);
    const checkpoint = collector.checkpoint({ stop: false }).catch(() => undefined);
    await waitUntil(() => preparing, "our checkpoint open (its prepare sent)", 5000);
    // b is refused admission, as a Gym parked in our checkpoint refuses: its worker waits for the
    // checkpoint to end. Then a replies, and its line cannot be appended: the collection fails.
    answers.get("b")!(503, { error: { code: "admission_closed", detail: "a checkpoint is open" } });
    await waitUntil(() => refusalSent, "b's refusal sent", 5000);
    await unappendable(out);
    answers.get("a")!(200, { reward: 1 });
    // b's worker is woken and comes back (its report) while our checkpoint is still open, not once it ends.
    await waitUntil(() => reports === 1, "b's worker back", 5000);
    expect(preparing).toBe(true);
    // The checkpoint is given up (see the next test) once its prepare answers; run() rejects after it.
    prepared.resolve();
    await expect(run).rejects.toMatchObject({ code: "EISDIR" });
    await checkpoint;
    expect(requests.sort()).toEqual(["a", "b"]);
  });

  it("a run that fails while our checkpoint is under way gives it up and resumes it before rejecting: no commit, publish or resume after the rejection", { timeout: 10_000 }, async () => {
    const out = join(dir, "results.jsonl");
    const { url, answers, dropped } = await heldRunServer("b");
    // Our checkpoint's prepare answers only once the collection has failed (b's /run dropped).
    let preparing = false;
    const fake = fakeController({
      prepare: async (req: never) => {
        preparing = true;
        await dropped.promise;
        return fake.base.prepare(req);
      },
    });
    const rows = ["a", "b"].map((rolloutId) => ({ rolloutId, task: {} }));
    const collector = collectorFor(fake.controller, url, { rows, concurrency: 2, outPath: out });
    await collector.start();
    const run = collector.run();
    await waitUntil(() => answers.has("a") && answers.has("b"), "a and b in flight", 5000);
    const checkpoint = collector.checkpoint({ stop: false });
    await waitUntil(() => preparing, "our checkpoint's prepare sent", 5000);
    await unappendable(out);
    answers.get("a")!(200, { reward: 1 });
    await expect(run).rejects.toMatchObject({ code: "EISDIR" });
    const atRejection = fake.calls.length;
    expect(await checkpoint).toMatchObject({ published: false });
    // The CLI releases the lock and closes NATS on the rejection: the checkpoint was closed before it.
    expect(fake.calls.slice(atRejection).map((c) => c.op)).toEqual([]);
    expect(fake.calls.map((c) => c.op)).toEqual(["prepare", "resume"]);
    expect(fake.state.open).toBeNull();
  });

  it("a run that fails waits for a retire still under way (and sends it no more) before rejecting", { timeout: 10_000 }, async () => {
    const out = join(dir, "results.jsonl");
    const { url, answers, dropped } = await heldRunServer("b");
    // c's attempt failed: its retire is under way, answered (unreachable) only once the collection has failed.
    let retireAnswered = false;
    const fake = fakeController({
      retire: async (req: never) => {
        fake.calls.push({ op: "retire", req });
        await dropped.promise;
        retireAnswered = true;
        throw new CheckpointError("unreachable", "a Gym server did not answer the retire");
      },
    });
    const rows = ["a", "b", "c"].map((rolloutId) => ({ rolloutId, task: {} }));
    const collector = collectorFor(fake.controller, url, { rows, concurrency: 3, outPath: out });
    await collector.start();
    const run = collector.run();
    await waitUntil(() => answers.size === 3, "a, b and c in flight", 5000);
    answers.get("c")!(500, { error: "boom" });
    await waitUntil(() => fake.calls.some((c) => c.op === "retire"), "c's retire sent", 5000);
    await unappendable(out);
    answers.get("a")!(200, { reward: 1 });
    await expect(run).rejects.toMatchObject({ code: "EISDIR" });
    expect(retireAnswered).toBe(true);
    const atRejection = fake.calls.length;
    // A failed retire is tried again every retireS while a row waits for it: not once the run failed.
    await delay(SHORT_PAUSES.retireS * 5);
    expect(fake.calls.slice(atRejection)).toEqual([]);
  });

  it("a run that fails waits at most --run-timeout-s for a retire the controller does not answer", { timeout: 10_000 }, async () => {
    const out = join(dir, "results.jsonl");
    const { url, answers } = await heldRunServer("b");
    const fake = fakeController({
      retire: async (req: never) => {
        fake.calls.push({ op: "retire", req });
        return new Promise(() => undefined);
      },
    });
    const { log, lines } = capturingLogger();
    const rows = ["a", "b", "c"].map((rolloutId) => ({ rolloutId, task: {} }));
    const collector = collectorFor(fake.controller, url, { rows, concurrency: 3, outPath: out, runTimeoutSeconds: 2, logger: log });
    await collector.start();
    const run = collector.run();
    await waitUntil(() => answers.size === 3, "a, b and c in flight", 5000);
    answers.get("c")!(500, { error: "boom" });
    await waitUntil(() => fake.calls.some((c) => c.op === "retire"), "c's retire sent", 5000);
    await unappendable(out);
    answers.get("a")!(200, { reward: 1 });
    await expect(run).rejects.toMatchObject({ code: "EISDIR" });
    expect(lines.filter((l) => l.msg.startsWith("our checkpoint, a retire or a forget under way did not end")).length).toBe(1);
    expect(lines.filter((l) => l.msg.startsWith("a worker did not come back")).length).toBe(0);
  });

  it("a run whose --out cannot be made fails before any /run: a later --new-collection tells by that file that no row finished", async () => {
    const sent: string[] = [];
    const url = await runServer((body) => (sent.push(body.rollout_id), { status: 200, body: { reward: 1 } }));
    const { controller } = fakeController();
    const collector = collectorFor(controller, url, { outPath: join(dir, "missing", "results.jsonl") });
    await collector.start();
    await expect(collector.run()).rejects.toMatchObject({ code: "ENOENT" });
    expect(sent).toEqual([]);
  });

  it("a run that fails ends the live progress line, so the error printed next starts on a line of its own", { timeout: 10_000 }, async () => {
    const written: string[] = [];
    const tty = { write: (s: string) => written.push(s), isTTY: true } as unknown as NodeJS.WritableStream;
    // The reply (whose append fails) comes once the live line is drawn (its timer redraws it every second).
    const out = join(dir, "results.jsonl");
    const url = await runServer(async () => {
      await waitUntil(() => written.length > 0, "the live line drawn", 5000);
      await unappendable(out);
      return { status: 200, body: { reward: 1 } };
    });
    const { controller } = fakeController();
    const collector = collectorFor(controller, url, { outPath: out, progress: new ProgressReporter(tty, 1000) });
    await collector.start();
    await expect(collector.run()).rejects.toMatchObject({ code: "EISDIR" });
    expect(written.some((s) => s.startsWith("\r["))).toBe(true);
    expect(written.at(-1)).toBe("\n");
  });
});

describe("collector while --run-url accepts no connections (the Gym down or restarting)", () => {
  it("rows refused at connect never started: they are sent again once it answers, with no failed attempt and no retire, whatever --max-attempts", { timeout: 20_000 }, async () => {
    const port = await closedPort();
    const { controller, calls } = fakeController();
    const { log, lines } = capturingLogger();
    const rows = ["a", "b", "c", "d", "e", "f"].map((rolloutId) => ({ rolloutId, task: {} }));
    const collector = collectorFor(controller, `http://127.0.0.1:${port}/run`, { rows, concurrency: 2, maxAttempts: 1, runTimeoutSeconds: 30, logger: log });
    await collector.start();
    const run = collector.run();
    // A row in flight was refused (with --max-attempts 1, counted it would fail) before the Gym comes back.
    await waitUntil(() => lines.some((l) => l.msg.startsWith("--run-url accepts no connections")), "the outage logged", 5000);
    const sent: string[] = [];
    server = createServer((req, res) => {
      let data = "";
      req.on("data", (chunk: Buffer) => (data += chunk.toString()));
      req.on("end", () => {
        const body = JSON.parse(data) as RunRequest;
        sent.push(`${body.rollout_id}:${body.attempt}`);
        res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1 }));
      });
    });
    await new Promise<void>((resolve) => server!.listen(port, "127.0.0.1", resolve));
    expect(await run).toMatchObject({ finished: 6, failed: 0 });
    expect(sent.sort()).toEqual(rows.map((r) => `${r.rolloutId}:0`)); // every row's first attempt, once
    expect(calls.filter((c) => c.op === "retire")).toEqual([]);
    expect(lines.filter((l) => l.msg.startsWith("/run failed"))).toEqual([]);
    expect(lines.filter((l) => l.msg.startsWith("--run-url accepts no connections"))).toHaveLength(1);
    expect(lines.some((l) => l.msg === "--run-url accepts connections again")).toBe(true);
  });

  it("a Gym server that drops every /run (crashed mid-run): each /run failed line says whether the row is sent again (try n of --max-attempts) or failed for good, without an HTTP-client stack; a spell of the same failure warns once", { timeout: 20_000 }, async () => {
    const { controller } = fakeController();
    const lines: { msg: string; level: number; retried?: boolean; tries?: number; max_attempts?: number; err?: { stack?: string; code?: string } }[] = [];
    // The logger `gym-ckpt collect` writes with.
    const log = createLogger("warn", { write: (line: string) => void lines.push(JSON.parse(line)) });
    server = createServer((req) => req.on("end", () => req.socket.destroy()).resume());
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}/run`;
    const rows = ["a", "b", "c"].map((rolloutId) => ({ rolloutId, task: {} }));
    const collector = collectorFor(controller, url, { rows, concurrency: 3, maxAttempts: 2, logger: log });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 0, failed: 3 });
    const runFailed = lines.filter((l) => l.msg.startsWith("/run failed"));
    expect(runFailed.filter((l) => l.err?.stack !== undefined)).toEqual([]);
    expect(runFailed.every((l) => typeof l.err?.code === "string")).toBe(true);
    // The first failure of the spell warns (the row is sent again); the same failure of the other rows is debug.
    expect(runFailed.filter((l) => l.retried === true)).toEqual([expect.objectContaining({ level: 40, tries: 1, max_attempts: 2 })]);
    // A row that fails for good always says so.
    expect(runFailed.filter((l) => l.retried === false)).toEqual(rows.map(() => expect.objectContaining({ level: 40, tries: 2, max_attempts: 2 })));
  });

  it("the outage lines name --run-url without its query: a key there (`?code=…`) is never logged", { timeout: 20_000 }, async () => {
    const port = await closedPort();
    const { controller } = fakeController();
    const { log, lines } = capturingLogger();
    const collector = collectorFor(controller, `http://127.0.0.1:${port}/run?code=SECRET-abc123`, { runTimeoutSeconds: 30, logger: log });
    await collector.start();
    const run = collector.run();
    await waitUntil(() => lines.some((l) => l.msg.startsWith("--run-url accepts no connections")), "the outage logged", 5000);
    server = createServer((_req, res) => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1 })));
    await new Promise<void>((resolve) => server!.listen(port, "127.0.0.1", resolve));
    expect(await run).toMatchObject({ finished: 1, failed: 0 });
    const outage = lines.filter((l) => l.msg.includes("--run-url accepts"));
    expect(outage.map((l) => (l as unknown as { run_url: string }).run_url)).toEqual([`http://127.0.0.1:${port}/run?[Redacted]`, `http://127.0.0.1:${port}/run?[Redacted]`]);
    expect(JSON.stringify(lines)).not.toContain("SECRET-abc123");
  });

  /** Node's fetch refusing at connect while `down()` (counted per row), the real one after. */
  function refusingFetch(down: () => boolean) {
    const realFetch = globalThis.fetch;
    const refusedSends: string[] = [];
    vi.stubGlobal("fetch", (input: Parameters<typeof fetch>[0], init?: RequestInit) => {
      if (!down()) return realFetch(input, init);
      refusedSends.push((JSON.parse(String(init?.body)) as RunRequest).rollout_id);
      return Promise.reject(Object.assign(new TypeError("fetch failed"), { cause: Object.assign(new Error("connect ECONNREFUSED 127.0.0.1"), { code: "ECONNREFUSED", syscall: "connect" }) }));
    });
    return refusedSends;
  }

  it("while --run-url refuses connections one row probes it, backing off; the others send nothing until a connection is made, then all go", { timeout: 20_000 }, async () => {
    let down = true;
    const refusedSends = refusingFetch(() => down);
    try {
      // /run replies when its rollout ends: the probe's first reply back is held until the others
      // arrived (a connection made is what says --run-url is back, not a reply minutes later).
      let sentAfter = 0;
      let othersCameBeforeTheProbesReply = false;
      const url = await runServer(async () => {
        if (++sentAfter === 1) othersCameBeforeTheProbesReply = await waitUntil(() => sentAfter === 20, "the other rows", 5000).then(() => true, () => false);
        return { status: 200, body: { reward: 1 } };
      });
      const { controller } = fakeController();
      const { log, lines } = capturingLogger();
      const rows = Array.from({ length: 20 }, (_, i) => ({ rolloutId: `r${i}`, task: {} }));
      const collector = collectorFor(controller, url, { rows, concurrency: 20, maxAttempts: 1, runTimeoutSeconds: 30, logger: log });
      await collector.start();
      const run = collector.run();
      // Down until 4 sends went again (each row re-sent every pause was 20 more per pause).
      await waitUntil(() => refusedSends.length >= 24, "sends refused again", 10_000);
      down = false;
      expect(await run).toMatchObject({ finished: 20, failed: 0 });
      const resent = refusedSends.slice(20);
      expect(new Set(resent).size).toBe(1); // one probe
      expect(sentAfter).toBe(20); // once it connects, every row went once
      expect(othersCameBeforeTheProbesReply).toBe(true);
      expect(lines.filter((l) => l.msg.startsWith("--run-url accepts connections again"))).toHaveLength(1);
    } finally {
      vi.unstubAllGlobals();
    }
  });

  it("rows waiting for the probe fail their attempt at their own --run-timeout-s without being sent again", { timeout: 20_000 }, async () => {
    const refusedSends = refusingFetch(() => true);
    try {
      const { controller } = fakeController();
      const rows = Array.from({ length: 10 }, (_, i) => ({ rolloutId: `r${i}`, task: {} }));
      const collector = collectorFor(controller, "http://127.0.0.1:9/run", { rows, concurrency: 10, maxAttempts: 1, runTimeoutSeconds: 0.6 });
      await collector.start();
      const begun = performance.now();
      expect(await collector.run()).toMatchObject({ finished: 0, failed: 10 });
      const took = performance.now() - begun;
      expect(took).toBeGreaterThanOrEqual(600);
      // Only the probe is sent again: a row's sends after its first come while it probes, and a row
      // that stopped probing (its attempt failed) is never sent again, so the re-sends are one run
      // of sends per row. Each row re-sent every 0.1 s interleaved them.
      const seen = new Set<string>();
      const resent = refusedSends.filter((row) => seen.has(row) || !seen.add(row));
      const probes = resent.filter((row, i) => row !== resent[i - 1]);
      expect(probes).toEqual([...new Set(probes)]);
      // The probe waits 0.1 s, then 0.2 s, before each send, plus one send per row handed the probe.
      // Bounded by the time the run took, not a fixed count: a loaded machine dispatches the rows
      // late (each after its dispatch-log sync), and the probe goes on until the last one's timeout.
      expect(resent.length).toBeLessThanOrEqual(Math.ceil(took / 100) + 10);
    } finally {
      vi.unstubAllGlobals();
    }
  });

  it("a row refused at connect for --run-timeout-s fails its attempt after all: an outage that does not end ends the run", { timeout: 20_000 }, async () => {
    const port = await closedPort();
    const { controller } = fakeController();
    const collector = collectorFor(controller, `http://127.0.0.1:${port}/run`, { maxAttempts: 1, runTimeoutSeconds: 0.5 });
    await collector.start();
    const begun = Date.now();
    expect(await collector.run()).toMatchObject({ finished: 0, failed: 1 });
    expect(Date.now() - begun).toBeGreaterThanOrEqual(500);
  });

  // Before, the outage was timed with Date.now(): a wall clock stepped back (NTP, a VM resume)
  // kept the row waiting for --run-url an hour longer, and one stepped ahead failed it at once.
  it("a wall-clock step during the outage does not move --run-timeout-s: the row still fails its attempt once that time passed", { timeout: 20_000 }, async () => {
    const port = await closedPort();
    const { controller } = fakeController();
    const { log, lines } = capturingLogger();
    const collector = collectorFor(controller, `http://127.0.0.1:${port}/run`, { maxAttempts: 1, runTimeoutSeconds: 1, logger: log });
    await collector.start();
    const run = collector.run();
    await waitUntil(() => lines.some((l) => l.msg.startsWith("--run-url accepts no connections")), "the outage logged", 5000);
    const wall = Date.now.bind(Date);
    const stepped = vi.spyOn(Date, "now").mockImplementation(() => wall() - 3_600_000);
    try {
      const ended = await Promise.race([run, new Promise<"still waiting">((resolve) => setTimeout(() => resolve("still waiting"), 8000).unref())]);
      expect(ended).toMatchObject({ finished: 0, failed: 1 });
    } finally {
      stepped.mockRestore();
    }
  });
});

describe("collector failures: rollout records", () => {
  const trajectory = { task_name: null, prompt: null, nodes: [], reward: 1, turns: 0, stop_condition: null, is_completed: true, replay: null };

  it("a run that fails mid-collection still writes the records of the rows it appended to --out (the next start never runs them again)", { timeout: 10_000 }, async () => {
    const log = join(dir, "dispatched.jsonl");
    const url = await runServer(async (body) => {
      // Once a's /run is served, the dispatch log can no longer be appended: b's dispatch fails the run.
      if (body.rollout_id === "a") {
        await rm(log);
        await mkdir(log);
      }
      return { status: 200, body: { reward: 1, trajectory } };
    });
    const fake = fakeController();
    const rows = ["a", "b"].map((rolloutId) => ({ rolloutId, task: {} }));
    const records = join(dir, "records");
    const collector = collectorFor(fake.controller, url, { rows, concurrency: 1, records: { dir: records, env: "gym", kind: "eval", everyRows: 1000, everySeconds: 600 } });
    await collector.start();
    await expect(collector.run()).rejects.toMatchObject({ code: "EISDIR" });
    expect([...(await readResults(join(dir, "results.jsonl"))).keys()]).toEqual(["a"]);
    const stats = collector.summary().records!;
    expect(stats.records).toBe(1);
    expect(await readFile(join(records, "rollouts", "step_1", "eval_rollouts_gym.jsonl"), "utf8")).toContain('"rollout_id":"a"');
  });
});

describe("collector restores whose outcome is unknown", () => {
  const checkpointId = "ckpt-20240101T000000-aaaaaaaa";
  const a0 = { rollout_id: "a", attempt: 0 };
  type Fake = ReturnType<typeof fakeController>;

  /**
   * Run 1 dispatched a@0 and crashed after a checkpoint continuing it; the collector of the next
   * start (not started) with `overrides`, which reach the fake through `fake()`.
   */
  async function restartedRun(overrides: (fake: () => Fake) => Parameters<typeof fakeController>[0] = () => ({}), handler?: RunHandler) {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [a0]);
    const fake: Fake = fakeController(overrides(() => fake));
    await publishCollection(fake.state, checkpointId, "run-1", [a0]);
    const sent: number[] = [];
    const url = await runServer((body) => (sent.push(body.attempt), handler ? handler(body) : { status: 200, body: { reward: 1 } }));
    return { ...fake, sent, url, collector: collectorFor(fake.controller, url) };
  }

  const ops = (calls: Call[], ...names: string[]) => calls.filter((c) => names.includes(c.op));

  it.each([
    ["outcome_unknown", true], // it ran and its reply was lost (the coordinator failed over mid-op)
    ["not_leader", false], // it never ran (no leader served it)
  ] as const)("a restore answered %s is sent again with the same id and scope, and its rows continue", async (code, ran) => {
    const asked: unknown[] = [];
    const { collector, calls, state, sent } = await restartedRun((fake) => ({
      restore: async (req: never) => {
        asked.push(req);
        if (asked.length > 1) return fake().base.restore(req);
        if (ran) await fake().base.restore(req);
        throw new CheckpointError(code, "no reply");
      },
    }));
    await collector.start();
    // the same op again: same id and scope (each try with its own deadline)
    expect(asked).toEqual([
      { checkpoint_id: checkpointId, episode_ids: [a0], deadline_ts: expect.any(Number) },
      { checkpoint_id: checkpointId, episode_ids: [a0], deadline_ts: expect.any(Number) },
    ]);
    expect(ops(calls, "retire")).toEqual([]);
    expect(state.open).toBeNull(); // the restored checkpoint was resumed
    expect(await collector.run()).toMatchObject({ finished: 1, continued: 1, restarted: 0 });
    expect(sent).toEqual([1]);
    expect((await readResults(join(dir, "results.jsonl"))).get("a")).toMatchObject({ attempt: 1, continued: true });
  });

  it("a resume of the restored checkpoint answered outcome_unknown is sent again, and its rows continue", async () => {
    let lost = 0;
    const { collector, calls, state, sent } = await restartedRun((fake) => ({
      resume: async (req: never) => {
        const reply = await fake().base.resume(req);
        if (lost++ === 0) throw new CheckpointError("outcome_unknown", "the reply was lost");
        return reply;
      },
    }));
    await collector.start();
    expect(ops(calls, "resume").map((c) => c.req.checkpoint_id)).toEqual([checkpointId, checkpointId]);
    expect(ops(calls, "retire")).toEqual([]);
    expect(state.open).toBeNull();
    expect(await collector.run()).toMatchObject({ finished: 1, continued: 1, restarted: 0 });
    expect(sent).toEqual([1]);
  });

  it("start-up reads answered outcome_unknown (its coordinator died with them in flight) are sent again: the start goes on and its rows continue", async () => {
    const lostOnce = new Set<string>();
    const once = (op: "status" | "list" | "get", send: (req: never) => Promise<unknown>) => async (req: never) => {
      if (!lostOnce.has(op)) {
        lostOnce.add(op);
        throw new CheckpointError("outcome_unknown", `no reply on ctl.${op}`);
      }
      return send(req);
    };
    const { collector, calls } = await restartedRun((fake) => ({
      status: once("status", () => fake().base.status()),
      list: once("list", () => fake().base.list()),
      get: once("get", (req) => fake().base.get(req)),
    }));
    await collector.start();
    expect([...lostOnce].sort()).toEqual(["get", "list", "status"]);
    expect(ops(calls, "restore").map((c) => c.req.checkpoint_id)).toEqual([checkpointId]);
    expect(await collector.run()).toMatchObject({ finished: 1, continued: 1, restarted: 0 });
  });

  it("a restore refused not_leader on every try never ran: the start fails without giving its continuation up, and the next start restores it", async () => {
    // A coordinator restarted with the job, not the ready leader yet (over HTTP, not_leader comes at once).
    let ready = false;
    const { collector, calls, sent, state, controller, url } = await restartedRun((fake) => ({
      restore: async (req: never) => (ready ? fake().base.restore(req) : Promise.reject(new CheckpointError("not_leader", "this coordinator is not the ready leader"))),
      retire: async (req: never) => (ready ? fake().base.retire(req) : Promise.reject(new CheckpointError("not_leader", "this coordinator is not the ready leader"))),
    }));
    await expect(collector.start()).rejects.toMatchObject({ code: "not_leader" });
    expect(state.open).toBeNull();
    ready = true;
    calls.length = 0;
    const next = collectorFor(controller, url);
    await next.start();
    expect(restores(calls)).toEqual([[a0]]);
    expect(ops(calls, "retire")).toEqual([]);
    expect(await next.run()).toMatchObject({ finished: 1, continued: 1, restarted: 0 });
    expect(sent).toEqual([1]);
  });

  it("a restore whose outcome stays unknown after three tries: attempt + 1 is retired (fencing the source too) and the row starts over as attempt + 2", async () => {
    let tries = 0;
    const { collector, calls, sent } = await restartedRun(() => ({
      restore: async () => {
        tries++;
        throw new CheckpointError("outcome_unknown", "no reply");
      },
    }));
    await collector.start();
    expect(tries).toBe(3);
    expect(ops(calls, "retire").map((c) => c.req.episode_ids)).toEqual([[{ rollout_id: "a", attempt: 1 }]]);
    expect(await collector.run()).toMatchObject({ finished: 1, continued: 0, restarted: 1 });
    expect(sent).toEqual([2]);
  });
});

describe("collector restored-source fences", () => {
  const checkpointId = "ckpt-20240101T000000-aaaaaaaa";
  const a0 = { rollout_id: "a", attempt: 0 };

  async function restoredRow(handler: RunHandler, overrides: Parameters<typeof fakeController>[0] = {}) {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [a0]);
    const fake = fakeController(overrides);
    await publishCollection(fake.state, checkpointId, "run-1", [a0]);
    const url = await runServer(handler);
    const collector = collectorFor(fake.controller, url, { checkpointTimeoutSeconds: 3 });
    await collector.start();
    expect(restores(fake.calls)).toEqual([[a0]]);
    return { ...fake, collector };
  }

  it("a row continued from a restore is forgotten once it replies (participants fence its source attempts until forget)", async () => {
    const { collector, calls } = await restoredRow(() => ({ status: 200, body: { reward: 1 } }));
    expect(await collector.run()).toMatchObject({ finished: 1, continued: 1 });
    expect(calls.filter((c) => c.op === "forget").map((c) => c.req.rollout_ids)).toEqual([["a"]]);
  });

  const forgets = (calls: Call[]) => calls.filter((c) => c.op === "forget").map((c) => c.req.rollout_ids);
  /** A forget that never gets out (the collector crashes first); `asked` records what it was given. */
  const lostForget = (asked: unknown[]) => ({ forget: (req: never) => (asked.push((req as { rollout_ids: string[] }).rollout_ids), new Promise<never>(() => undefined)) });

  it("a forget queued when the collector crashed is sent by the next start (participants would keep the finished rollout's fences for good)", async () => {
    // a@0 fails and is retired, a@1 finishes; its forget never gets out before the crash.
    const url = await runServer((body) => (body.rollout_id === "a" && body.attempt === 0 ? { status: 500, body: {} } : { status: 200, body: { reward: 1 } }));
    const rows = ["a", "b"].map((rolloutId) => ({ rolloutId, task: {} }));
    const lost: unknown[] = [];
    const first = collectorFor(fakeController(lostForget(lost)).controller, url, { rows });
    await first.start();
    void first.run();
    await waitUntil(() => lost.length === 1, "a's forget sent");
    await waitUntil(async () => (await readResults(join(dir, "results.jsonl"))).size === 2, "both rows in --out");
    // Crashed: the next start forgets a (finished at attempt 1), not b (finished at attempt 0, never fenced).
    const next = fakeController();
    const collector = collectorFor(next.controller, url, { rows });
    await collector.start();
    expect(forgets(next.calls)).toEqual([["a"]]);
    expect(await collector.run()).toMatchObject({ rows: 2, finished: 2 });
    expect(forgets(next.calls)).toEqual([["a"]]);
  });

  it("…and with its stop checkpoint still open, after the restore closed it, carried in the new log until then", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 1 }]);
    await appendResult(join(dir, "results.jsonl"), { rollout_id: "a", attempt: 1, reward: 1, continued: false, finished_at: 1, response: { reward: 1 } });
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const lost: unknown[] = [];
    const crashed = fakeController(lostForget(lost));
    await publishCollection(crashed.state, checkpointId, "run-1", [], true);
    await collectorFor(crashed.controller, url).start();
    await waitUntil(() => lost.length === 1, "a's forget sent", 2000);
    expect(lost).toEqual([["a"]]);
    expect(crashed.state.open).toBeNull(); // sent once the restore was resumed: the coordinator refuses it while one is open
    // Crashed before its forget got out: the start after that still sends it.
    const next = fakeController();
    await collectorFor(next.controller, url).start();
    expect(forgets(next.calls)).toEqual([["a"]]);
  });

  /** A restored row whose reply lands between commit and publish of the checkpoint taken while it runs. */
  async function continuedRowReplyingMidCheckpoint() {
    const release = deferred();
    let arrived = false;
    const out = join(dir, "results.jsonl");
    const fake = await restoredRow(
      async () => {
        arrived = true;
        await release.promise;
        return { status: 200, body: { reward: 1 } };
      },
      {
        publish: async (req: never) => {
          release.resolve();
          await waitUntil(async () => (await readResults(out)).size === 1, "a's result");
          return fake.base.publish(req);
        },
      },
    );
    fake.calls.length = 0;
    const run = fake.collector.run();
    await waitUntil(() => arrived, "the /run of a@1");
    return { fake, run };
  }

  it("a continued row replying while a checkpoint is open is forgotten only after that checkpoint's resume", async () => {
    const { fake, run } = await continuedRowReplyingMidCheckpoint();
    expect((await fake.collector.checkpoint({ stop: false })).published).toBe(true);
    expect(await run).toMatchObject({ finished: 1, continued: 1 });
    expect(fake.calls.map((c) => c.op)).toEqual(["prepare", "commit", "publish", "resume", "forget"]);
  });

  it("sends no forget after a stop checkpoint (it stays open, and forget would be refused)", async () => {
    const { fake, run } = await continuedRowReplyingMidCheckpoint();
    expect((await fake.collector.checkpoint({ stop: true })).published).toBe(true);
    await run;
    expect(fake.calls.map((c) => c.op)).toEqual(["prepare", "commit", "publish"]);
  });
});

describe("collector --checkpoint-dir", () => {
  it("the shared root mounted at another path on the collector's host: it writes and reads collection.json (and left-out episode lists) through its own --checkpoint-dir", async () => {
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const fake = fakeController({
      commit: async (req: never) => {
        const reply = await fake.base.commit(req);
        const id = (req as { checkpoint_id: string }).checkpoint_id;
        // The owner's list left out (read back from its records), and the checkpoint named as the coordinator's host mounts it.
        const owner = await committedOwner(reply.checkpoint_dir, id, []);
        return { ...reply, checkpoint_id: id, checkpoint_dir: join("/mnt/coordinator-view-of-the-share", id), participants: [owner] };
      },
    });
    const first = collectorFor(fake.controller, url);
    await first.start();
    expect((await first.checkpoint({ stop: false })).published).toBe(true);
    expect(await latestContinued(fake.state)).toEqual([]);
    const next = collectorFor(fake.controller, url);
    await next.start();
    expect(await next.run()).toMatchObject({ finished: 1, failed: 0 });
  });

  it("a --checkpoint-dir that is not the coordinator's root: the checkpoint is refused (invalid_request), resumed and not published; a start with LATEST elsewhere is refused too", async () => {
    const mine = join(dir, "not-the-root");
    await mkdir(mine);
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    const fake = fakeController();
    const first = collectorFor(fake.controller, url, { checkpointDir: mine });
    await first.start();
    const refusal = { code: "invalid_request", message: expect.stringContaining(`--checkpoint-dir ${mine} is not the coordinator's checkpoint root`) };
    await expect(first.checkpoint({ stop: false })).rejects.toMatchObject(refusal);
    expect(fake.calls.map((c) => c.op)).toEqual(["prepare", "commit", "resume"]);
    expect(fake.state.open).toBeNull();

    await publishCollection(fake.state, "ckpt-20240101T000000-aaaaaaaa", "run-1", []);
    await expect(collectorFor(fake.controller, url, { checkpointDir: mine }).start()).rejects.toMatchObject(refusal);
  });

  it("LATEST holding another controller's state file (gym-ckpt checkpoint --state-file): nothing is restored and the rows run, as for another run's LATEST", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const { controller, calls, state } = fakeController();
    const id = "ckpt-20240101T000000-aaaaaaaa";
    await mkdir(join(dir, id), { recursive: true });
    const text = '{"step":5}\n';
    await writeFile(join(dir, id, "state.json"), text);
    state.latest = id;
    state.published[id] = { file: "state.json", sha256: sha256Hex(text) };
    const sent: number[] = [];
    const url = await runServer((body) => (sent.push(body.attempt), { status: 200, body: { reward: 1 } }));
    const collector = collectorFor(controller, url);
    await collector.start();
    expect(restores(calls)).toEqual([]);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
    // a@0 was in flight when run-1 died: it starts over from input as attempt 1.
    expect(sent).toEqual([1]);
  });

  it("LATEST without its collection.json: start is refused invalid_checkpoint_state, not a raw ENOENT", async () => {
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", [{ rollout_id: "a", attempt: 0 }]);
    const { controller, calls, state } = fakeController();
    await publishCollection(state, "ckpt-20240101T000000-aaaaaaaa", "run-1", [{ rollout_id: "a", attempt: 0 }]);
    await rm(join(dir, "ckpt-20240101T000000-aaaaaaaa", "collection.json"));
    const url = await runServer(() => ({ status: 200, body: { reward: 1 } }));
    await expect(collectorFor(controller, url).start()).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("collection.json") });
    expect(restores(calls)).toEqual([]);
  });
});

describe("collector halt (SIGINT, SIGHUP)", () => {
  const trajectory = { task_name: null, prompt: null, nodes: [], reward: 1, turns: 0, stop_condition: null, is_completed: true, replay: null };

  it("sends no retire once halted: one under way that fails is not tried again", { timeout: 10_000 }, async () => {
    const { url, answers } = await heldRunServer("a");
    const retired = deferred();
    const fake = fakeController({
      retire: async (req: never) => {
        fake.calls.push({ op: "retire", req });
        await retired.promise;
        throw new CheckpointError("unreachable", "a Gym server did not answer the retire");
      },
    });
    const rows = ["a", "c"].map((rolloutId) => ({ rolloutId, task: {} }));
    const { log, lines } = capturingLogger();
    const collector = collectorFor(fake.controller, url, { rows, concurrency: 2, logger: log });
    await collector.start();
    const run = collector.run();
    await waitUntil(() => answers.size === 2, "a and c in flight", 5000);
    answers.get("c")!(500, { error: "boom" });
    await waitUntil(() => fake.calls.some((c) => c.op === "retire"), "c's retire sent", 5000);
    await collector.halt({ resumeCheckpoint: true });
    const atHalt = fake.calls.length;
    retired.resolve(); // the retire under way fails after the halt
    await delay(SHORT_PAUSES.retireS * 5);
    expect(fake.calls.slice(atHalt)).toEqual([]);
    expect(lines.filter((l) => l.msg.startsWith("retire failed")).map((l) => l.msg)).toEqual(["retire failed; the next start retires its attempts"]);
    answers.get("a")!(200, { reward: 1 }); // dropped: the worker comes back
    await run;
  });

  it("sends no /run and appends no row once halted, so every row in --out is in the records flushed after it or counted unwritten", async () => {
    // The first 8 /runs answer at once; the ones after are held until the test lets them answer, after the halt.
    const held: (() => void)[] = [];
    let requests = 0;
    const url = await runServer(async () => {
      if (++requests > 8) await new Promise<void>((resolve) => held.push(resolve));
      return { status: 200, body: { reward: 1, trajectory } };
    });
    const fake = fakeController();
    const rows = Array.from({ length: 40 }, (_, i) => ({ rolloutId: `r${i}`, task: {} }));
    const collector = collectorFor(fake.controller, url, {
      rows,
      concurrency: 4,
      records: { dir: join(dir, "records"), env: "gym", kind: "eval", everyRows: 1000, everySeconds: 600 },
    });
    await collector.start();
    const run = collector.run();
    const out = join(dir, "results.jsonl");
    await waitUntil(async () => held.length === 4 && (await readResults(out)).size === 8, "8 rows finished, 4 held in flight");
    const halting = collector.halt();
    for (const answer of held.splice(0)) answer(); // replies that arrive after the halt
    await halting;
    await collector.flushRecords();
    const reported = collector.summary().records!;
    await run; // every worker has taken its last reply: nothing can be appended any more
    const inResults = (await readResults(out)).size;
    expect(inResults).toBe(8);
    expect(reported.records + reported.unwritten).toBe(inResults);
    expect(requests).toBe(12);
  });
});

describe("collector across a coordinator failover (the engine, then its successor over the same participants and journal)", () => {
  type Fate = "pass" | "no-leader" | "died-before" | "died-after";
  const a0 = { rollout_id: "a", attempt: 0 };
  /** Collectors a test leaves running (a failing one included): halted before the root goes. */
  const running: Collector[] = [];
  afterEach(async () => {
    await Promise.all(running.splice(0).map((c) => c.halt()));
  });
  const collectorIn = (w: { controller: CollectorController; url: string }) => {
    const collector = collectorFor(w.controller, w.url, { checkpointTimeoutSeconds: 5 });
    running.push(collector);
    return collector;
  };

  /**
   * The collector's controller is the real engine over fake participants (the Gym's control planes).
   * `fate(op, n)` decides the n-th call of `op`: served; refused `not_leader` (no leader served it);
   * or its coordinator dies before the op arrives ("died-before") or once it did the op and its
   * background work, before the reply ("died-after"): a successor over the same participants,
   * journal and checkpoint root takes over and recovers, and the collector gets `outcome_unknown`.
   * The `/run` server plays the environment: refused admission while a participant is parked,
   * else held until `release` and then until no participant is parked.
   */
  async function failoverWorld(fate: (op: string, n: number) => Fate = () => "pass") {
    let coordinator = makeEngine(dir);
    coordinator.clock.current = Date.now(); // the collector's deadlines are wall-clock times
    const { fake, journal } = coordinator;
    let epoch = 7;
    const recoveries: string[][] = [];
    const failover = async () => {
      coordinator.leadership.demote();
      coordinator.engine.leadershipLost();
      coordinator = makeEngine(dir, { successorOf: coordinator, epoch: ++epoch });
      recoveries.push((await coordinator.engine.recover()).map((r) => `${r.checkpoint_id}:${r.action}`));
    };
    const counts = new Map<string, number>();
    const call = async <O extends ControllerOp>(op: O, req: unknown): Promise<CtlReplyOf<O>> => {
      const n = (counts.get(op) ?? 0) + 1;
      counts.set(op, n);
      const f = fate(op, n);
      if (f === "no-leader") throw new CheckpointError("not_leader", `no coordinator serves ${op}`);
      if (f === "died-before" || f === "died-after") {
        if (f === "died-after") {
          await dispatchController(coordinator.engine, op, req).catch(() => undefined);
          await coordinator.writer.settled();
          const id = (req as { checkpoint_id?: string }).checkpoint_id;
          if (op === "resume" && id) await waitUntil(() => !journal.entries.has(id), "the resumed checkpoint's journal entry to go");
        }
        await failover();
        throw new CheckpointError("outcome_unknown", `no reply on ctl.${op}`);
      }
      return dispatchController(coordinator.engine, op, req);
    };
    const controller: CollectorController = {
      prepare: (r) => call("prepare", r),
      commit: (r) => call("commit", r),
      publish: (r) => call("publish", r),
      resume: (r) => call("resume", r),
      restore: (r) => call("restore", r),
      retire: (r) => call("retire", r),
      forget: (r) => call("forget", r),
      list: () => call("list", {}),
      status: () => call("status", {}),
      get: (id) => call("get", { checkpoint_id: id }),
    };
    const parked = () => [...fake.state.values()].some((s) => s.phase !== "idle");
    const release = deferred();
    const arrived: EpisodeId[] = [];
    const url = await runServer(async (body) => {
      if (parked()) return { status: 503, body: { error: { code: "admission_closed", detail: "a checkpoint is open" } } };
      arrived.push({ rollout_id: body.rollout_id, attempt: body.attempt });
      await release.promise;
      await waitUntil(() => !parked(), `${body.rollout_id}@${body.attempt} resumed`);
      return { status: 200, body: { reward: 1 } };
    });
    return { controller, fake, journal, url, release, arrived, recoveries, engine: () => coordinator.engine, failover };
  }

  /** A failover world whose environment exports row a, its collector started and a's /run arrived. */
  async function runningRowA(fate: (op: string, n: number) => Fate) {
    const w = await failoverWorld(fate);
    w.fake.exported.set("environment.e1", ["a"]);
    const collector = collectorIn(w);
    await collector.start();
    const run = collector.run();
    await waitUntil(() => w.arrived.length === 1, "the /run of a");
    return { w, collector, run };
  }

  /** Participants sent `op` since `from` (an index into the fake's calls). */
  const sent = (fake: { calls: { op: string }[] }, op: string, from = 0) => fake.calls.slice(from).filter((c) => c.op === op).length;

  it.each([
    ["died-after", "published, then SIGKILLed before its reply"],
    ["died-before", "SIGKILLed before the publish reached it (its successor re-drives the decided commit)"],
  ] as const)("a stop checkpoint's publish whose coordinator %s (%s) is sent again: published, and its parked Gym is not resumed", async (fate, _when) => {
    const { w, collector } = await runningRowA((op, n) => (op === "publish" && n === 1 ? fate : "pass"));
    const result = await collector.checkpoint({ stop: true });
    expect(w.recoveries).toHaveLength(1);
    expect(result.published).toBe(true);
    expect((await w.controller.list()).latest).toBe(result.checkpointId);
    expect(sent(w.fake, "resume")).toBe(0); // still parked: the scheduler's grace period is for stopping, not for running on
    expect(collector.summary()).toMatchObject({ checkpoints: 1, stopped: true });
  });

  it("a checkpoint's publish whose coordinator died after publishing it is sent again: counted as published, then resumed", async () => {
    const { w, collector, run } = await runningRowA((op, n) => (op === "publish" && n === 1 ? "died-after" : "pass"));
    const result = await collector.checkpoint({ stop: false });
    expect(w.recoveries).toEqual([[`${result.checkpointId}:published_open`]]);
    expect(result.published).toBe(true);
    expect(w.engine().openCheckpoint).toBeNull();
    w.release.resolve();
    expect(await run).toMatchObject({ finished: 1, checkpoints: 1 });
  });

  it("a publish whose every reply was lost is checked against the catalog, that get sent again while no leader serves it: counted as published, then resumed", async () => {
    const { w, collector, run } = await runningRowA((op, n) => (op === "publish" ? "died-after" : op === "get" && n === 1 ? "no-leader" : "pass"));
    const result = await collector.checkpoint({ stop: false });
    expect(result.published).toBe(true);
    expect((await w.controller.list()).latest).toBe(result.checkpointId);
    w.release.resolve();
    expect(await run).toMatchObject({ finished: 1, checkpoints: 1 });
  });

  it("a stop checkpoint's commit whose coordinator died once it had committed (reply lost): the successor re-drives it and keeps it committed, so the collector sends it again and publishes, the Gym left parked", async () => {
    const { w, collector } = await runningRowA((op, n) => (op === "commit" && n === 1 ? "died-after" : "pass"));
    const result = await collector.checkpoint({ stop: true });
    expect(w.recoveries).toEqual([[`${result.checkpointId}:committed`]]);
    expect(result.published).toBe(true);
    expect((await w.controller.list()).latest).toBe(result.checkpointId);
    expect(sent(w.fake, "resume")).toBe(0);
    expect(sent(w.fake, "commit")).toBe(10); // five by the first coordinator, five by its successor's re-drive: the retry sent none
  });

  it("a commit that failed at a participant with outcome_unknown (the checkpoint stays committing) is not sent again but aborted", async () => {
    const w = await failoverWorld();
    w.fake.exported.set("environment.e1", ["a"]);
    w.fake.set("agent", "a1", "commit", { error: "outcome_unknown" });
    const collector = collectorIn(w);
    await collector.start();
    const run = collector.run();
    await waitUntil(() => w.arrived.length === 1, "the /run of a");
    await expect(collector.checkpoint({ stop: false })).rejects.toMatchObject({ code: "outcome_unknown" });
    expect(sent(w.fake, "commit")).toBe(5);
    expect(w.engine().openCheckpoint).toBeNull(); // withdrawn and resumed
    w.release.resolve();
    expect(await run).toMatchObject({ finished: 1, checkpoints: 0 });
  });

  /**
   * Run 1 (a failover world's first collector) stops with a@0 in flight (SIGTERM: published, the Gym
   * parked in it); then the Gym servers restart (fresh processes) and run 1's /run dies with it.
   * `gymKept`: the Gym servers go on instead, parked in the stop checkpoint (a job requeued while its
   * Gym stays up), and only run 1's /run dies.
   */
  async function stoppedRun(w: Awaited<ReturnType<typeof failoverWorld>>, { gymKept = false } = {}): Promise<string> {
    w.fake.exported.set("environment.e1", ["a"]);
    const first = collectorIn(w);
    await first.start();
    void first.run();
    await waitUntil(() => w.arrived.length === 1, "the /run of a");
    const { published, checkpointId } = await first.checkpoint({ stop: true });
    expect(published).toBe(true);
    await first.halt();
    server!.closeAllConnections();
    if (!gymKept) w.fake.state.clear();
    w.arrived.length = 0;
    return checkpointId;
  }

  // dispatched.jsonl lost (deleted by hand, a scratch directory wiped): the log named the stop
  // checkpoint as this collection's. Before, a start without it took the stop checkpoint its own Gym
  // is parked in for another controller's: nothing resumed, and every /run was refused admission
  // until someone ran `gym-ckpt resume <id>` by hand. Its collection.json names the collection.
  it("its own published stop checkpoint, the Gym kept parked in it, is resumed by a start that lost dispatched.jsonl (collection.json names the collection), and its rows restart from input", async () => {
    const w = await failoverWorld();
    const checkpointId = await stoppedRun(w, { gymKept: true });
    await rm(join(dir, "dispatched.jsonl"));
    const from = w.fake.calls.length;
    const collector = collectorIn(w);
    await collector.start();
    expect([...w.fake.state.values()].every((s) => s.phase === "idle")).toBe(true);
    expect(w.fake.calls.slice(from).filter((c) => c.op === "resume").map((c) => c.body.checkpoint_id)).toContain(checkpointId);
    w.release.resolve();
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0, restarted: 1, continued: 0 });
    // a@0, parked and resumed, was retired before a@1 went: nothing finishes twice.
    expect(w.arrived).toEqual([{ rollout_id: "a", attempt: 1 }]);
    expect(w.fake.ops("retire").slice(-1)[0]?.body).toMatchObject({ episode_ids: [a0] });
  });

  // The resume lets the stop checkpoint's attempts run on at the Gym until the start's retire
  // fences them. Without a log, a start failing between the two (its retire refused, no leader; a
  // crash) left nothing naming them: the next start found nothing parked and sent a@0 again beside
  // the resumed a@0. The lost log is put back (from collection.json) before the resume.
  it("a start that lost dispatched.jsonl and fails after resuming its own stop checkpoint, before its retire: the next start still retires the attempts it resumed", async () => {
    const w = await failoverWorld((op, n) => (op === "retire" && n <= 3 ? "no-leader" : "pass"));
    w.fake.memory = true; // live processes: they refuse a restore of the checkpoint they resumed
    const checkpointId = await stoppedRun(w, { gymKept: true });
    await rm(join(dir, "dispatched.jsonl"));
    const failing = collectorIn(w);
    await expect(failing.start()).rejects.toMatchObject({ code: "not_leader" });
    expect([...w.fake.state.values()].every((s) => s.phase === "idle")).toBe(true); // resumed: a@0 runs on
    const collector = collectorIn(w);
    await collector.start();
    w.release.resolve();
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0, restarted: 1, continued: 0 });
    // As with the log never lost: the restore of the checkpoint the live processes resumed is
    // refused, and a@1 is retired (fencing the a@0 resumed) before a@2 goes. Never a@0 again.
    expect(w.fake.ops("restore").map((c) => c.body.checkpoint_id)).toContain(checkpointId);
    expect(w.fake.ops("retire").slice(-1)[0]?.body).toMatchObject({ episode_ids: [{ rollout_id: "a", attempt: 1 }] });
    expect(w.arrived).toEqual([{ rollout_id: "a", attempt: 2 }]);
  });

  it("a start that lost dispatched.jsonl and fails before resuming its own stop checkpoint: the next start resumes it and retires its attempts", async () => {
    const w = await failoverWorld((op, n) => (op === "resume" && n <= 3 ? "no-leader" : "pass"));
    const checkpointId = await stoppedRun(w, { gymKept: true });
    await rm(join(dir, "dispatched.jsonl"));
    const failing = collectorIn(w);
    await expect(failing.start()).rejects.toMatchObject({ code: "not_leader" });
    expect([...w.fake.state.values()].some((s) => s.phase !== "idle")).toBe(true);
    const from = w.fake.calls.length;
    const collector = collectorIn(w);
    await collector.start();
    expect(w.fake.calls.slice(from).filter((c) => c.op === "resume").map((c) => c.body.checkpoint_id)).toContain(checkpointId);
    w.release.resolve();
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
    expect(w.fake.ops("retire").slice(-1)[0]?.body).toMatchObject({ episode_ids: [a0] });
    expect(w.arrived).toEqual([{ rollout_id: "a", attempt: 1 }]);
  });

  it("another collection's published stop checkpoint (its collection.json names another --out), the Gym parked in it, is not resumed by a start without dispatched.jsonl", async () => {
    const w = await failoverWorld();
    const checkpointId = await stoppedRun(w, { gymKept: true });
    await rm(join(dir, "dispatched.jsonl"));
    const from = w.fake.calls.length;
    const { log, lines } = capturingLogger();
    const other = collectorFor(w.controller, w.url, { checkpointTimeoutSeconds: 5, outPath: join(dir, "other-results.jsonl"), logger: log });
    running.push(other);
    await other.start();
    expect(w.fake.calls.slice(from).filter((c) => c.op === "resume")).toEqual([]);
    expect([...w.fake.state.values()].some((s) => s.phase !== "idle")).toBe(true);
    // The operator is told what holds the Gym, whose it is, and what to run if it is this
    // collection's after all: a resume alone would let its attempts (a@0) run on beside the rows
    // this collection sends again, so they are retired too, with this collector stopped meanwhile.
    const warning = lines.find((l) => l.msg.includes(checkpointId))?.msg ?? "";
    expect(warning).toContain(`gym-ckpt resume ${checkpointId}`);
    expect(warning).toContain("another collection's");
    expect(warning).toContain(`--out ${join(dir, "results.jsonl")}`);
    expect(warning).toContain("stop this collector");
    expect(warning).toContain(`gym-ckpt resume ${checkpointId}; gym-ckpt retire --episodes a;`);
  });

  // Whose the stop checkpoint is, and which attempts it holds, only its collection.json tells.
  // Guessed as this collection's, a resume would let attempts run on that no retire names; guessed
  // as another's, a start would send rows again from attempt 0 beside them should anyone resume it.
  // So the start is refused, saying which file is damaged and what to do; nothing resumed or sent.
  it.each(["garbled", "missing"])(
    "a start that lost dispatched.jsonl, the Gym parked in a published stop checkpoint whose collection.json is %s, is refused (invalid_checkpoint_state) naming the file and what to do; nothing resumed or sent",
    async (damage) => {
      const w = await failoverWorld();
      const checkpointId = await stoppedRun(w, { gymKept: true });
      await rm(join(dir, "dispatched.jsonl"));
      const statePath = join(dir, checkpointId, "collection.json");
      if (damage === "garbled") await writeFile(statePath, '{"checkpoint_id": ');
      else await rm(statePath);
      const from = w.fake.calls.length;
      const collector = collectorIn(w);
      const refusal = await collector.start().then(
        () => undefined,
        (error: unknown) => error,
      );
      expect(refusal).toMatchObject({ code: "invalid_checkpoint_state" });
      const message = (refusal as Error).message;
      expect(message).toContain("dispatched.jsonl is not there");
      expect(message).toContain(`published stop checkpoint ${checkpointId}`);
      expect(message).toContain(statePath);
      expect(message).toContain(`gym-ckpt resume ${checkpointId}`);
      expect(message).toContain(join(dir, checkpointId, "checkpoint.json"));
      expect(w.fake.calls.slice(from).filter((c) => c.op === "resume" || c.op === "retire")).toEqual([]);
      expect([...w.fake.state.values()].some((s) => s.phase !== "idle")).toBe(true);
      expect(w.arrived).toEqual([]);
      await expect(readFile(join(dir, "dispatched.jsonl"))).rejects.toMatchObject({ code: "ENOENT" });
    },
  );

  it("a checkpoint left open whose resume landed just before its coordinator died (reply lost): the successor's not_found means nothing is left open, and the start goes on", async () => {
    const w = await failoverWorld((op, n) => (op === "resume" && n === 1 ? "died-after" : "pass"));
    // A predecessor collector died in its checkpoint's prepare: the checkpoint is open, the Gym parked.
    await (await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1")).recordCheckpoint("ckpt-20240101T000000-aaaaaaaa");
    await w.controller.prepare({ checkpoint_id: "ckpt-20240101T000000-aaaaaaaa", deadline_ts: Date.now() / 1000 + 60 });
    const collector = collectorIn(w);
    await collector.start();
    expect(w.recoveries).toEqual([[]]); // the successor knows nothing of it: resumed and removed
    w.release.resolve();
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
  });

  it("the restore's resume landed just before its coordinator died (reply lost): the successor's not_found is not a failed restore, and the row continues as attempt + 1", async () => {
    let restoring = false;
    const w = await failoverWorld((op, n) => (restoring && op === "resume" && n === 1 ? "died-after" : "pass"));
    const checkpointId = await stoppedRun(w);
    restoring = true;
    const collector = collectorIn(w);
    await collector.start();
    expect(w.recoveries).toEqual([[]]);
    expect(w.fake.ops("restore").map((c) => c.body.checkpoint_id)).toContain(checkpointId);
    w.release.resolve();
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0, continued: 1, restarted: 0 });
    expect(w.arrived).toEqual([{ rollout_id: "a", attempt: 1 }]);
  });

  it("a restore that landed but stayed unanswered through every try (its coordinator died, no leader after): the successor keeps it restored, and it is still resumed once a leader serves", async () => {
    let restoring = false;
    const w = await failoverWorld((op, n) => (restoring && op === "restore" ? (n === 1 ? "died-after" : n <= 3 ? "no-leader" : "pass") : "pass"));
    const checkpointId = await stoppedRun(w);
    restoring = true;
    const collector = collectorIn(w);
    await collector.start();
    expect(w.recoveries).toEqual([[`${checkpointId}:restored`]]);
    w.release.resolve();
    await waitUntil(() => w.engine().openCheckpoint === null, "the restored checkpoint resumed", 10_000);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
    expect(w.arrived.map((e) => e.attempt)).toEqual([a0.attempt + 2]); // its attempt + 1 was retired when the tries ran out
  }, 20_000);

  it("the restore's resume unanswered through every try (no leader that long): the restored checkpoint is still resumed once a leader serves, not left parked until the participants' lease", async () => {
    let restoring = false;
    const w = await failoverWorld((op, n) => (restoring && op === "resume" && n <= 3 ? "no-leader" : "pass"));
    await stoppedRun(w);
    restoring = true;
    const collector = collectorIn(w);
    await collector.start();
    w.release.resolve();
    await waitUntil(() => w.engine().openCheckpoint === null, "the restored checkpoint resumed", 10_000);
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
    expect(w.arrived.map((e) => e.attempt)).toEqual([a0.attempt + 2]); // its attempt + 1 was retired when the tries ran out
  }, 20_000);
});

describe("collector while its retires keep failing (a Gym server down)", () => {
  // Before, each failed retire (one per failed row, then one every --retry pause) logged its own
  // warning with the error's stack: a Gym server down for minutes flooded the collector's log.
  it("warns once when the retires start failing, and says once when they go through again", { timeout: 20_000 }, async () => {
    const lines: { msg: string; level: number; tries?: number }[] = [];
    const log = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as { msg: string; level: number }) });
    let retires = 0;
    const { controller, base } = fakeController({
      retire: async (req: never) => {
        if (++retires <= 6) throw new CheckpointError("unreachable", "retire failed on 1 participant(s): environment/e1: unreachable");
        return base.retire(req);
      },
    });
    const url = await runServer((body) => (body.attempt === 0 ? { status: 500, body: { oops: 1 } } : { status: 200, body: { reward: 1 } }));
    const rows = ["a", "b", "c"].map((rolloutId) => ({ rolloutId, task: {} }));
    const collector = collectorFor(controller, url, { rows, concurrency: 3, maxAttempts: 3, runTimeoutSeconds: 30, logger: log });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 3, failed: 0 });
    expect(retires).toBeGreaterThan(6);
    const failing = lines.filter((l) => l.msg.startsWith("retire failed"));
    expect(failing).toHaveLength(1);
    expect(failing[0]).toMatchObject({ level: 40, err: { code: "unreachable" } });
    const back = lines.filter((l) => l.msg.startsWith("retires go through again"));
    expect(back).toHaveLength(1);
    expect(back[0]).toMatchObject({ level: 30, failed_tries: 6 });
  });
});
