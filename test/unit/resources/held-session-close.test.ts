import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { REPLAYABLE_END_HOLD_MS } from "../../../participants/kinds/resources/index.js";
import { ReplayCounter, resourcesWorld } from "./resources-world.js";

/**
 * The hold of a session a replayable `/verify` ended is a timer of the kind. Once the app is
 * closed (the server shut down), that timer must not fire into the server: its
 * `retireSessionState` would run on a server that already released what it frees with.
 */
let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

class ClosingCounter extends ReplayCounter {
  closed = false;
  readonly freedAfterClose: string[] = [];
  override async retireSessionState(sessionId: string): Promise<void> {
    if (this.closed) this.freedAfterClose.push(sessionId);
    await super.retireSessionState(sessionId);
  }
}

describe("the hold of a verified session once the app closed", () => {
  it("calls no hook of the closed server when it would have passed", async () => {
    const server = new ClosingCounter();
    const a = await world.harness(server);
    const cookie = String((await a.post("/ng-rollout/r1/seed_session", {})).headers["set-cookie"]).split(";")[0]!;
    expect((await a.post("/ng-rollout/r1/verify", { expected: 0 }, cookie)).json()).toEqual({ reward: 1, count: 0 });
    await a.app.close();
    server.closed = true;
    a.clock.advance(REPLAYABLE_END_HOLD_MS);
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(server.freedAfterClose).toEqual([]);
  });
});
