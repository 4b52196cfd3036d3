import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { NO_HTTP, startWorld, type World } from "./coordinator-harness.js";
import { waitUntil } from "../support/wait-until.js";

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
});
afterAll(async () => {
  await world?.close();
});

describe("a coordinator stopped before its lease is ready", () => {
  it("does not start a recovery when the lease becomes ready while the stop is still closing its controller APIs", async () => {
    const coordinator = await world.startCoordinator({ ...NO_HTTP, lease_ms: 400 });
    world.coordinators.splice(world.coordinators.indexOf(coordinator), 1);
    // It won the lease at start and waits out its first lease period.
    expect(coordinator.lease.state()).toMatchObject({ leader: true, ready: false });
    const recover = vi.spyOn(coordinator.engine, "recover");
    // The daemon's onReady, as the lease calls it (it starts the recovery in its first tick).
    const onReady = vi.spyOn((coordinator.lease as unknown as { options: { onReady: (epoch: number) => Promise<void> } }).options, "onReady");
    // The stop closes the controller APIs before it stops the lease: natsApi.stop waits for the
    // answers still in flight (an op of an earlier term of this coordinator's, or over HTTP
    // fastify's close waits for its requests). Here that lasts until the lease became ready.
    const natsStop = coordinator.natsApi.stop.bind(coordinator.natsApi);
    coordinator.natsApi.stop = async () => {
      await waitUntil(() => onReady.mock.calls.length > 0, "the lease to become ready during the stop");
      await natsStop();
    };
    await coordinator.stop();
    // Before: the lease (not stopped yet) became ready meanwhile and onReady ran a recovery (status
    // probes carrying its epoch, re-driven decisions) in a coordinator already stopping.
    expect(recover).not.toHaveBeenCalled();
  }, 20_000);
});
