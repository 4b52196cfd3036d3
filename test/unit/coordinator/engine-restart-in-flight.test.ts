import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { refusalOf } from "../../support/refusal.js";
import { waitUntil } from "../../support/wait-until.js";
import { FOUR_KINDS, makeEngine, writers } from "./fake-participants.js";

// A Gym process SIGKILLed while the coordinator waits on its reply never answers; a restart
// announces a new incarnation. The request to the old process must stop waiting then, not hold
// the op for the whole request_attempt_ms and retry into the new process's stale_incarnation.
let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-restart-in-flight-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

const E1 = { kind: "environment" as const, instance: "e1" };
const firstIncarnations = () => new Map(FOUR_KINDS.map((m) => [`${m.kind}.${m.instance}`, `${m.instance}-old`]));

describe("a participant restarted while its guarded request is in flight", () => {
  it("a commit waiting on the dead process fails unreachable once the new process announces itself; nothing is published", async () => {
    const { engine, fake, membership } = makeEngine(root, { incarnations: firstIncarnations() });
    await engine.prepare({ checkpoint_id: "c1" });
    fake.set("environment", "e1", "commit", "hang");
    const committing = refusalOf(engine.commit({ checkpoint_id: "c1", episode_ids: null, stop: false }));
    await waitUntil(() => membership.watchers(E1) === 1, "the commit to e1 in flight");
    // Another member's heartbeat-borne change is not e1's restart.
    membership.announce({ kind: "model", instance: "m1" }, "m1-old");
    membership.announce(E1, "e1-new");
    const error = await committing;
    expect(error.code).toBe("unreachable");
    expect(error.message).toContain("environment/e1 restarted after checkpoint c1 opened (incarnation e1-old → e1-new)");
    expect(error.message).toContain("the request in flight to the old process was abandoned");
    // One try: no retry went to the new process.
    expect(fake.ops("commit").filter((c) => c.instance === "e1")).toHaveLength(1);
    expect(membership.watchers(E1)).toBe(0);
    expect(existsSync(join(root, "c1", "checkpoint.json"))).toBe(false);
  });

  it("a resume waiting on the dead process counts it as resumed: the new process holds nothing of the checkpoint", async () => {
    const { engine, fake, membership } = makeEngine(root, { incarnations: firstIncarnations() });
    await engine.prepare({ checkpoint_id: "c2" });
    fake.set("environment", "e1", "resume", "hang");
    const resuming = engine.resume({ checkpoint_id: "c2" });
    await waitUntil(() => membership.watchers(E1) === 1, "the resume to e1 in flight");
    membership.announce(E1, "e1-new");
    const reply = await resuming;
    expect(reply.participants.find((p) => p.instance === "e1")).toMatchObject({ kind: "environment", idempotent: true });
    expect(reply.participants).toHaveLength(FOUR_KINDS.length);
    expect(fake.ops("resume").filter((c) => c.instance === "e1")).toHaveLength(1);
    expect(membership.watchers(E1)).toBe(0);
  });

  it("the view announcing the incarnation the request was addressed to (a lagging view catching up) does not abandon it", async () => {
    const { engine, fake, membership } = makeEngine(root, { incarnations: firstIncarnations() });
    await engine.prepare({ checkpoint_id: "c3" });
    let answer!: () => void;
    const answered = new Promise<void>((resolve) => (answer = resolve));
    const request = fake.request.bind(fake);
    fake.request = async (subject, body, options) => {
      if (subject.endsWith(".environment.e1.commit")) await answered;
      return request(subject, body, options);
    };
    const committing = engine.commit({ checkpoint_id: "c3", episode_ids: null, stop: false });
    await waitUntil(() => membership.watchers(E1) === 1, "the commit to e1 in flight");
    membership.announce(E1, "e1-old");
    answer();
    expect((await committing).participants).toHaveLength(FOUR_KINDS.length);
    await engine.resume({ checkpoint_id: "c3" });
  });

  it("a restore (addressed to whichever process is there) waiting on the dead process is sent again at once, to the new process", async () => {
    const { engine, fake, membership } = makeEngine(root, { incarnations: firstIncarnations() });
    await engine.checkpoint({ checkpoint_id: "c4", episode_ids: null, stop: false, controller_state: null });
    fake.set("environment", "e1", "restore", "hang");
    const restoring = engine.restore({ checkpoint_id: "c4", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await waitUntil(() => membership.watchers(E1) === 1, "the restore to e1 in flight");
    // The new process answers, naming itself as the restorer (as a participant's restore reply does).
    fake.set("environment", "e1", "restore", "ok");
    fake.restorers.set("environment.e1", "e1-new");
    membership.announce(E1, "e1-new");
    const reply = await restoring;
    expect(reply.participants.find((p) => p.instance === "e1")).toMatchObject({ restored: ["r1-a1"] });
    expect(fake.ops("restore").filter((c) => c.instance === "e1")).toHaveLength(2);
    expect(membership.watchers(E1)).toBe(0);
    await engine.resume({ checkpoint_id: "c4" });
  });
});
