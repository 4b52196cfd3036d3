import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startWorld, type World } from "./coordinator-harness.js";
import { refusalOf } from "../support/refusal.js";
import { waitUntil } from "../support/wait-until.js";

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
  const coordinator = await world.startCoordinator();
  await coordinator.whenReady();
});
afterAll(async () => {
  await world?.close();
});

/**
 * A `stop` checkpoint leaves the participants parked on purpose. If the controller (or an operator:
 * docs/operations.md's token rotation starts with `gym-ckpt checkpoint --stop`) then decides to go
 * on after all, `resume <id>` is the documented way to release them. The coordinator that published
 * it answers success but sends nothing: every participant stays parked until its lease expires
 * (deadline + 600 s). A coordinator that did not publish it (after a restart) would resume them
 * (resume of an id it has neither open nor closed asks every participant's status).
 */
describe("resume of a published stop checkpoint", () => {
  it("releases the participants still parked in it", async () => {
    await world.client.checkpoint({ checkpoint_id: "stop-1", stop: true });
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("committed");
    const reply = await world.client.resume({ checkpoint_id: "stop-1" });
    const phases = world.participants.map((p) => `${p.kind}/${p.instance}:${p.handle.controlPlane.currentPhase}`);
    expect({ resumed: reply.participants.length, phases }).toEqual({
      resumed: world.participants.length,
      phases: world.participants.map((p) => `${p.kind}/${p.instance}:idle`),
    });
  }, 30_000);
});

/**
 * A checkpoint id reused after the coordinator and the Gym servers restarted (a training job that
 * restarts from step-1100 and reaches step 1200 again), where the earlier attempt at that id was
 * committed at some participants and then aborted: `<root>/step-1200/` is a partial checkpoint
 * (no checkpoint.json, the participants' gym/ directory), which is not published and which
 * retention deletes as garbage.
 */
describe("a checkpoint id whose directory holds an aborted, partial checkpoint", () => {
  it("is checkpointed (the stale participants' files are taken away), not parked, prepared and then failed at commit", async () => {
    world.participant("policy").adapter.failNext("exportRecords");
    await world.client.prepare({ checkpoint_id: "step-1200" });
    expect((await refusalOf(world.client.commit({ checkpoint_id: "step-1200" }))).code).toBe("internal_error");
    await world.client.resume({ checkpoint_id: "step-1200" });
    // Its leader takes the abandoned directory away as it closes; one that crashed first leaves it
    // behind, as made here: the participants' files, no checkpoint.json.
    await waitUntil(() => !existsSync(join(world.root, "step-1200")), "the abandoned checkpoint's directory taken away");
    await mkdir(join(world.root, "step-1200", "gym", "environment", "env1"), { recursive: true });
    await writeFile(join(world.root, "step-1200", "gym", "environment", "env1", "manifest.json"), "{}\n");
    expect(existsSync(join(world.root, "step-1200", "checkpoint.json"))).toBe(false);

    // the whole job restarts: a new coordinator, fresh Gym servers
    await Promise.all(world.coordinators.splice(0).map((c) => c.stop()));
    await world.stopParticipants();
    await world.startParticipants();
    const second = await world.startCoordinator();
    await second.whenReady();

    // The controller already wrote its state file for the new attempt: it stays.
    await writeFile(join(world.root, "step-1200", "trainer.json"), "{}\n");
    const reply = await world.client.checkpoint({ checkpoint_id: "step-1200", controller_state: { file: "trainer.json" } });
    expect(reply.checkpoint_id).toBe("step-1200");
    expect(await readFile(join(world.root, "step-1200", "trainer.json"), "utf8")).toBe("{}\n");
    expect(existsSync(join(world.root, "step-1200", "checkpoint.json"))).toBe(true);

    // A link in its place (participants would refuse to write through it): refused before anything is journaled or sent.
    const elsewhere = await mkdtemp(join(tmpdir(), "gym-ckpt-elsewhere-"));
    await symlink(elsewhere, join(world.root, "step-1300"));
    expect(await refusalOf(world.client.checkpoint({ checkpoint_id: "step-1300" }))).toMatchObject({ code: "checkpoint_conflict" });
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  }, 60_000);
});
