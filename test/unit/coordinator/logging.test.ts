import { Writable } from "node:stream";
import { describe, expect, it } from "vitest";
import { createLogger } from "../../../coordinator/telemetry/logger.js";

describe("coordinator logs", () => {
  it("are JSON and redact tokens, passwords and Authorization headers", () => {
    const lines: string[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        lines.push(chunk.toString());
        done();
      },
    });
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
    const lines: string[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        lines.push(chunk.toString());
        done();
      },
    });
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
    const lines: string[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        lines.push(chunk.toString());
        done();
      },
    });
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
