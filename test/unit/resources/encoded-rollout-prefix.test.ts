import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CounterServer } from "../../../participants/gym/resources-server/counter-server.js";
import { counterRecord, resourcesWorld } from "./resources-world.js";

/**
 * Fastify's router decodes the path: `/ng-%72ollout/r1/increment` reaches the prefixed handler. The
 * middleware must read the episode the same way, or it sees no prefix and takes the episode from
 * the cookie: a late request of the attempt a restore continued (r1, fenced) would use and claim
 * the session of r1-a1.
 */
let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

describe("percent-encoded rollout prefix", () => {
  it("does not bypass the fence of a session restored as the next attempt", async () => {
    const record = counterRecord("r1", "sessionAAAA", 2);
    await world.writeCheckpoint("c1", [record]);
    const server = new CounterServer();
    const b = await world.harness(server);
    await b.call("restore", { checkpoint_id: "c1", episode_ids: [record.episode_id] });
    await b.call("resume", { checkpoint_id: "c1" });

    const plain = await b.post("/ng-rollout/r1/increment", {}, "ng_session=sessionAAAA");
    expect(plain.json().error.code).toBe("stale_attempt");
    const encoded = await b.post("/ng-%72ollout/r1/increment", {}, "ng_session=sessionAAAA");
    expect(encoded.statusCode).not.toBe(200);
    expect(server.counters.get("sessionAAAA")).toBe(2);
    expect(b.kind.readiness().counts.restored).toBe(1); // still unclaimed by its replacement
  });

  it("is the episode of the route it reaches: an encoded seed binds its own episode", async () => {
    const b = await world.harness(new CounterServer());
    const seed = await b.post("/ng-%72ollout/r5-a2/seed_session", {});
    expect(seed.statusCode).toBe(200);
    const cookie = String(seed.headers["set-cookie"]).split(";")[0]!;
    expect(b.kind.sessionEpisode(cookie.split("=")[1]!)).toEqual({ rollout_id: "r5", attempt: 2 });
    // The same session under another attempt's (encoded) prefix is another attempt's request.
    expect((await b.post("/%6Eg-rollout/r5-a1/increment", {}, cookie)).json().error.code).toBe("stale_attempt");
  });
});
