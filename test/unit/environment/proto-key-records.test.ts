import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { FsCheckpointStorage } from "../../../participants/storage/fs-storage.js";
import { WriteGate } from "../../../participants/storage/write-gate.js";
import { AgentRecordSchema } from "../../../participants/kinds/agent/index.js";
import { EnvironmentRecordSchema } from "../../../participants/kinds/environment/index.js";
import { ResourcesSessionRecordSchema } from "../../../participants/kinds/resources/resources-session-record.js";

/**
 * Records carry opaque JSON (boundaries, session states) whose keys are the episode code's: one
 * named `__proto__` is data like any other. The control plane writes what the record schema parsed
 * (on export) and installs what it parsed (on restore), so a schema that dropped the key altered
 * the checkpoint silently.
 */
const boundaryText = '{"next":"loop","__proto__":{"turn":3},"state":{"__proto__":"kept"}}';

let root: string;
beforeEach(async () => (root = await mkdtemp(join(tmpdir(), "gym-ckpt-proto-"))));
afterEach(() => rm(root, { recursive: true, force: true }));

describe("records keep __proto__ keys of their JSON as data", () => {
  it("environment: a boundary's __proto__ key survives export parsing and the write/read round trip", async () => {
    const record = { episode_id: { rollout_id: "r1", attempt: 0 }, task_digest: "0".repeat(64), boundary: JSON.parse(boundaryText) };
    const exported = EnvironmentRecordSchema.parse(record);
    expect(JSON.stringify(exported.boundary)).toBe(boundaryText);
    expect(Object.getPrototypeOf(exported.boundary)).toBe(Object.prototype);

    const storage = new FsCheckpointStorage();
    const target = { checkpointDir: join(root, "c1"), checkpointId: "c1", kind: "environment" as const, instance: "env0" };
    await storage.write(target, [exported], { gate: new WriteGate(), createdAt: 1, extra: {} });
    const read = await storage.read(target, EnvironmentRecordSchema);
    expect(JSON.stringify(read.records[0]!.boundary)).toBe(boundaryText);
  });

  it("agent: the boundary and the legacy episode boundary keep their __proto__ keys", () => {
    const record = { episode_id: { rollout_id: "r1", attempt: 0 }, mode: "legacy", session_key: "r1", session: null, boundary: JSON.parse(boundaryText), episode: JSON.parse(boundaryText) };
    const parsed = AgentRecordSchema.parse(record);
    expect(JSON.stringify(parsed.boundary)).toBe(boundaryText);
    expect(JSON.stringify(parsed.episode)).toBe(boundaryText);
  });

  it("resources: a session state's __proto__ keys survive, at every depth", () => {
    const stateText = '{"__proto__":{"count":1},"items":[{"__proto__":null}]}';
    const record = { episode_id: { rollout_id: "r1", attempt: 0 }, session_id: "sessionAAAA", state: JSON.parse(stateText), owner: null };
    const parsed = ResourcesSessionRecordSchema.parse(record);
    expect(JSON.stringify(parsed.state)).toBe(stateText);
    expect(Object.getPrototypeOf(parsed.state)).toBe(Object.prototype);
  });
});
