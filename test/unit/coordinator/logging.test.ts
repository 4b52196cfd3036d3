import { Writable } from "node:stream";
import { describe, expect, it } from "vitest";
import { createLogger } from "../../../coordinator/telemetry/logger.js";

/** A stream a logger writes to, and the lines it wrote. */
function logSink(): { lines: string[]; sink: Writable } {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(chunk.toString());
      done();
    },
  });
  return { lines, sink };
}

describe("coordinator logs", () => {
  it("are JSON and redact tokens, passwords and Authorization headers", () => {
    const { lines, sink } = logSink();
    const logger = createLogger("info", sink);
    logger.child({ checkpoint_id: "c1" }).child({ kind: "model", instance: "m" }).info(
      { token: "t0ken", config: { token: "t1", nats: { pass: "pw1" } }, headers: { authorization: "Bearer abc" }, request: { authorization: "Bearer def" } },
      "hello",
    );
    const record = JSON.parse(lines[0]!) as Record<string, any>;
    expect(record.msg).toBe("hello");
    expect(record.checkpoint_id).toBe("c1");
    expect(record.kind).toBe("model");
    const text = lines.join("");
    for (const secret of ["t0ken", "t1", "pw1", "abc", "def"]) expect(text).not.toContain(secret);
  });
});

describe("coordinator log lines carry each key once", () => {
  it("the engine's lines under the daemon's bindings (pino writes a rebound key twice)", async () => {
    const { mkdtemp, rm } = await import("node:fs/promises");
    const { tmpdir } = await import("node:os");
    const { join } = await import("node:path");
    const { makeEngine, writers } = await import("./fake-participants.js");
    const { lines, sink } = logSink();
    const daemonLogger = createLogger("info", sink).child({ component: "coordinator", coordinator_id: "c0", deployment: "d" });
    const root = await mkdtemp(join(tmpdir(), "gym-ckpt-logkeys-"));
    try {
      const { engine } = makeEngine(root, { logger: daemonLogger });
      await engine.checkpoint({ checkpoint_id: "k1", episode_ids: null, stop: false, controller_state: null });
      await Promise.all(writers.splice(0).map((w) => w.settled()));
    } finally {
      await rm(root, { recursive: true, force: true });
    }
    expect(lines.length).toBeGreaterThan(0);
    for (const line of lines) {
      const keys = [...line.matchAll(/"([a-z_]+)":/g)].map((m) => m[1]!);
      // top-level keys only matter, but any repeated binding shows up here first
      for (const key of ["component", "module", "coordinator_id", "deployment", "checkpoint_id"]) {
        expect(keys.filter((k) => k === key).length, `${key} in ${line}`).toBeLessThanOrEqual(1);
      }
    }
  });
});

describe("a retire or forget outside any checkpoint", () => {
  // Its wire checkpoint_id is a placeholder (the op's name): a line naming checkpoint_id "retire"
  // sends whoever greps the logs by checkpoint id after a checkpoint that does not exist.
  it("logs each participant's refusal with kind, instance, op and code, and no checkpoint_id", async () => {
    const { mkdtemp, rm } = await import("node:fs/promises");
    const { tmpdir } = await import("node:os");
    const { join } = await import("node:path");
    const { makeEngine } = await import("./fake-participants.js");
    const { lines, sink } = logSink();
    const root = await mkdtemp(join(tmpdir(), "gym-ckpt-logretire-"));
    try {
      const { engine, fake } = makeEngine(root, { logger: createLogger("info", sink) });
      fake.set("environment", "e1", "retire", "unreachable");
      fake.set("environment", "e1", "forget", "unreachable");
      await expect(engine.retire({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] })).rejects.toMatchObject({ code: "unreachable" });
      await expect(engine.forget({ rollout_ids: ["r1"] })).rejects.toMatchObject({ code: "unreachable" });
    } finally {
      await rm(root, { recursive: true, force: true });
    }
    const records = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    const refused = records.filter((r) => r["msg"] === "participant_refused");
    expect(refused.map((r) => r["op"])).toEqual(["retire", "forget"]);
    for (const r of refused) expect(r).toMatchObject({ kind: "environment", instance: "e1", code: "unreachable" });
    for (const r of records) expect(r, JSON.stringify(r)).not.toHaveProperty("checkpoint_id");
  });
});

describe("a failed op's error in the log", () => {
  function sinkLines() {
    const { lines, sink } = logSink();
    return { lines, sink };
  }

  // Before, controller_op_failed carried the error's whole data (every blocker of every
  // participant): 40 environments with 100 blockers each made one 220 KB line, which log shippers
  // cut or drop (Docker splits lines at 16 KB) — the one line saying why the checkpoint failed.
  it("stays bounded however many participants refused, and still says what failed and why", async () => {
    const { mkdtemp, rm } = await import("node:fs/promises");
    const { tmpdir } = await import("node:os");
    const { join } = await import("node:path");
    const { makeEngine } = await import("./fake-participants.js");
    const { lines, sink } = sinkLines();
    const members = Array.from({ length: 40 }, (_, i) => ({ kind: "environment" as const, instance: `env${i}` }));
    const root = await mkdtemp(join(tmpdir(), "gym-ckpt-logsize-"));
    try {
      const { engine, fake } = makeEngine(root, { logger: createLogger("info", sink), members });
      for (const m of members) fake.set("environment", m.instance, "prepare", { notReady: Array.from({ length: 100 }, (_, j) => `${m.instance}-rollout-${j}-0123456789abcdef0123456789abcdef`) });
      await expect(engine.checkpoint({ checkpoint_id: "big", episode_ids: null, stop: false, controller_state: null })).rejects.toMatchObject({ code: "prepare_incomplete" });
    } finally {
      await rm(root, { recursive: true, force: true });
    }
    for (const line of lines) expect(line.length, line.slice(0, 200)).toBeLessThan(16 * 1024);
    const failed = lines.map((l) => JSON.parse(l) as Record<string, any>).find((r) => r["msg"] === "controller_op_failed");
    expect(failed).toMatchObject({ checkpoint_id: "big", op: "checkpoint", code: "prepare_incomplete", err: { code: "prepare_incomplete", message: expect.stringMatching(/^checkpoint big aborted: .*environment\/env0: 100 blocker\(s\)/) } });
    // A catalog refusal is an outcome, not a defect: no stack trace.
    expect(failed?.err).not.toHaveProperty("stack");
    expect(JSON.stringify(failed?.err.data)).toContain("env0");
  });

  it("keeps the stack of an internal_error and of any other error", async () => {
    const { CheckpointError } = await import("../../../protocol/index.js");
    const { lines, sink } = sinkLines();
    const logger = createLogger("info", sink);
    logger.error({ err: new CheckpointError("internal_error", "boom") }, "a");
    logger.error({ err: new TypeError("fetch failed") }, "b");
    logger.warn({ err: new CheckpointError("unreachable", "env/e1: no responders") }, "c");
    const [internal, other, refusal] = lines.map((l) => JSON.parse(l) as { err: Record<string, unknown> });
    expect(internal?.err["stack"]).toMatch(/boom\n\s+at /);
    expect(other?.err["stack"]).toMatch(/fetch failed\n\s+at /);
    expect(refusal?.err).toMatchObject({ code: "unreachable", message: "env/e1: no responders" });
    expect(refusal?.err).not.toHaveProperty("stack");
  });

  // pino's serializer folds a cause into the message and stack only: its code (EACCES of a
  // storage_error, ECONNREFUSED of a fetch) was no field, and a refusal's stack (with the cause's) is dropped.
  it("keeps the code, syscall and path of the error's cause as fields", async () => {
    const { CheckpointError } = await import("../../../protocol/index.js");
    const { lines, sink } = sinkLines();
    const logger = createLogger("info", sink);
    const denied = Object.assign(new Error("EACCES: permission denied, mkdir '/ckpt/c1'"), { code: "EACCES", syscall: "mkdir", path: "/ckpt/c1" });
    logger.warn({ err: new CheckpointError("storage_error", "checkpoint c1: mkdir failed", { cause: denied }) }, "a");
    logger.warn({ err: new TypeError("fetch failed", { cause: Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:1"), { code: "ECONNREFUSED" }) }) }, "b");
    const [storage, fetchFailed] = lines.map((l) => JSON.parse(l) as { err: Record<string, unknown> });
    expect(storage?.err).toMatchObject({ code: "storage_error", cause: { type: "Error", code: "EACCES", syscall: "mkdir", path: "/ckpt/c1" } });
    expect(storage?.err).not.toHaveProperty("stack");
    expect(fetchFailed?.err).toMatchObject({ cause: { code: "ECONNREFUSED" } });
  });
});

describe("a prepare that does not complete", () => {
  // Before, the coordinator said only `prepare_incomplete` at info with a count (`blockers: 1`):
  // a checkpoint not taken was invisible at level warn, and which participant held it up was not said.
  it("is a warning naming the participants that held it up, and why", async () => {
    const { mkdtemp, rm } = await import("node:fs/promises");
    const { tmpdir } = await import("node:os");
    const { join } = await import("node:path");
    const { makeEngine } = await import("./fake-participants.js");
    const { lines, sink } = logSink();
    const root = await mkdtemp(join(tmpdir(), "gym-ckpt-logprep-"));
    try {
      const { engine, fake } = makeEngine(root, { logger: createLogger("info", sink) });
      fake.set("environment", "e1", "prepare", { notReady: ["r1@0", "r2@0"] });
      expect((await engine.prepare({ checkpoint_id: "held" })).prepared).toBe(false);
      // A controller polling prepare with the same id until it is ready: one warning, not one per poll.
      expect((await engine.prepare({ checkpoint_id: "held" })).prepared).toBe(false);
      expect((await engine.prepare({ checkpoint_id: "held" })).prepared).toBe(false);
      await engine.resume({ checkpoint_id: "held" });
    } finally {
      await rm(root, { recursive: true, force: true });
    }
    const incomplete = lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((r) => r["msg"] === "prepare_incomplete");
    expect(incomplete[0]).toMatchObject({ level: 40, checkpoint_id: "held", stopped_at: ["environment"], blockers: 1, blocked_by: ["environment/e1: 2 blocker(s)"] });
    expect(incomplete.map((r) => r["level"])).toEqual([40, 30, 30]);
  });
});

describe("retires outside any checkpoint that keep failing (a Gym server down)", () => {
  // Before, each retry of a controller's retire (the collector sends one a second while a Gym
  // server is down, for up to --run-timeout-s) logged participant_refused and controller_op_failed
  // at warn: two warnings a second per collector for the whole outage.
  it("warn once per participant and op, log the repeats at debug, and say once when they go through again", async () => {
    const { mkdtemp, rm } = await import("node:fs/promises");
    const { tmpdir } = await import("node:os");
    const { join } = await import("node:path");
    const { makeEngine } = await import("./fake-participants.js");
    const { lines, sink } = logSink();
    const root = await mkdtemp(join(tmpdir(), "gym-ckpt-logspell-"));
    try {
      const { engine, fake } = makeEngine(root, { logger: createLogger("info", sink) });
      fake.set("environment", "e1", "retire", "unreachable");
      for (let i = 0; i < 5; i++) await expect(engine.retire({ episode_ids: [{ rollout_id: "r1", attempt: i }] })).rejects.toMatchObject({ code: "unreachable" });
      fake.set("environment", "e1", "retire", "ok");
      await engine.retire({ episode_ids: [{ rollout_id: "r1", attempt: 5 }] });
      // A spell that ended is not kept (participants come and go: one kept per name would grow for good).
      expect((engine as unknown as { outsideSpells: Map<string, unknown> }).outsideSpells.size).toBe(0);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
    const records = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    const warned = records.filter((r) => r["level"] === 40).map((r) => r["msg"]);
    expect(warned.filter((m) => String(m).startsWith("participant_refused"))).toHaveLength(1);
    expect(warned.filter((m) => String(m).startsWith("controller_op_failed"))).toHaveLength(1);
    expect(records.find((r) => r["msg"] === "participant_answers_again")).toMatchObject({ level: 30, op: "retire", kind: "environment", instance: "e1", failed_tries: 5 });
    expect(records.find((r) => r["msg"] === "controller_op_succeeds_again")).toMatchObject({ level: 30, op: "retire", failed_tries: 5 });
  });
});
