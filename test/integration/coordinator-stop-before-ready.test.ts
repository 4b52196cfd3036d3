import { afterAll, beforeAll, describe, expect, it } from "vitest";
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
    const leaseReady: number[] = [];
    const recoveries: number[] = [];
    const coordinator = await world.startCoordinator(
      { ...NO_HTTP, lease_ms: 400 },
      {
        hooks: {
          onLeaseReady: (epoch) => void leaseReady.push(epoch),
          beforeRecover: (epoch) => void recoveries.push(epoch),
          // The stop closes the controller APIs before it stops the lease, waiting for the answers
          // still in flight (an op of an earlier term of this coordinator's, or over HTTP fastify's
          // close waits for its requests). Here that lasts until the lease became ready.
          whileStoppingApis: () => waitUntil(() => leaseReady.length > 0, "the lease to become ready during the stop"),
        },
      },
    );
    world.coordinators.splice(world.coordinators.indexOf(coordinator), 1);
    // It won the lease at start and waits out its first lease period.
    expect(coordinator.lease.state()).toMatchObject({ leader: true, ready: false });
    await coordinator.stop();
    // Before: the lease (not stopped yet) became ready meanwhile and onReady ran a recovery (status
    // probes carrying its epoch, re-driven decisions) in a coordinator already stopping.
    expect({ leaseReady: leaseReady.length, recoveries }).toEqual({ leaseReady: 1, recoveries: [] });
  }, 20_000);
});
