import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { Kind } from "../../../protocol/index.js";
import { makeEngine, writers } from "./fake-participants.js";
import { refusalOf } from "../../support/refusal.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-resume-failures-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

/**
 * Resume continues past failures and answers one combined error (reference §2.1). On the wire a
 * refusal is only {code, detail}, cut at 4096 characters: the detail names every participant that
 * failed, with its code, before any per-participant text (docs/api.md, resume).
 */
describe("resume past failures", () => {
  it("the refusal the controller receives names every participant that failed to resume", async () => {
    const agents = Array.from({ length: 25 }, (_, i) => ({ kind: "agent" as Kind, instance: `agent${String(i).padStart(2, "0")}` }));
    const { engine, fake } = makeEngine(root, { members: [{ kind: "environment", instance: "e1" }, ...agents] });
    await engine.prepare({ checkpoint_id: "many" });
    for (const a of agents) fake.set("agent", a.instance, "resume", "unreachable");
    const error = await refusalOf(engine.resume({ checkpoint_id: "many" }));
    expect(error.code).toBe("unreachable");
    const wire = error.toReply().error.detail;
    const missing = agents.filter((a) => !wire.includes(`agent/${a.instance}:`)).map((a) => a.instance);
    expect(missing).toEqual([]);
  });
});
