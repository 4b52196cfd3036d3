import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CounterServer } from "../../../participants/gym/resources-server/counter-server.js";
import { counterRecord, resourcesWorld } from "./resources-world.js";

let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

describe("the reference counter server and a session whose id is __proto__", () => {
  it("a restored __proto__ session is served and exported again with its count, like any other id", async () => {
    // `__proto__` is a valid session id (9 characters of [A-Za-z0-9_-]): a record may carry it.
    const record = counterRecord("r1", "__proto__", 5);
    await world.writeCheckpoint("c1", [record]);
    const server = new CounterServer();
    const b = await world.harness(server);
    await b.call("restore", { checkpoint_id: "c1", episode_ids: [record.episode_id] });
    await b.call("resume", { checkpoint_id: "c1" });
    const incremented = await b.post("/ng-rollout/r1-a1/increment", {}, "ng_session=__proto__");
    expect(incremented.json()).toEqual({ count: 6 });
    const states = await server.exportSessionStates(["__proto__"]);
    expect(Object.hasOwn(states, "__proto__")).toBe(true);
    expect(states["__proto__"]).toEqual({ count: 6 });
    // The kind's export keeps it (before: "session no longer held by the server; not exported").
    const exported = await b.kind.exportRecords(null);
    expect(exported).toEqual([{ episode_id: { rollout_id: "r1", attempt: 1 }, session_id: "__proto__", state: { count: 6 }, owner: null }]);
  });
});
