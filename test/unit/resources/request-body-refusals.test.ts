import { readFile } from "node:fs/promises";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CounterServer } from "../../../participants/gym/resources-server/counter-server.js";
import { resourcesWorld } from "./resources-world.js";

/**
 * docs/resources.md: "Request bodies are JSON (an empty body is {}) of at most 1 MiB, nested at most
 * 128 levels deep; anything else is refused with invalid_request before a route runs."
 */
let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

describe("request bodies the SDK promises to refuse", () => {
  it("a text/plain body is refused before the route runs (it does not seed a session)", async () => {
    const b = await world.harness(new CounterServer());
    const reply = await b.app.inject({ method: "POST", url: "/ng-rollout/r1/seed_session", headers: { "content-type": "text/plain" }, payload: "not json" });
    expect(reply.statusCode).toBe(400);
    expect(reply.json().error.code).toBe("invalid_request");
    expect(b.kind.readiness().counts.sessions).toBe(0);
  });

  it("so is a body without a content type, and one whose JSON is labelled otherwise", async () => {
    const b = await world.harness(new CounterServer());
    for (const headers of [{}, { "content-type": "application/x-www-form-urlencoded" }, { "content-type": "text/plain" }]) {
      const reply = await b.app.inject({ method: "POST", url: "/ng-rollout/r1/seed_session", headers, payload: "{}" });
      expect(reply.json().error.code).toBe("invalid_request");
    }
    expect(b.kind.readiness().counts).toMatchObject({ sessions: 0, inflight: 0 });
    // A bodyless POST (a close without payload) and a JSON one with a charset still pass.
    expect((await b.app.inject({ method: "POST", url: "/ng-rollout/r1/close_session" })).statusCode).toBe(200);
    const seeded = await b.app.inject({ method: "POST", url: "/ng-rollout/r1/seed_session", headers: { "content-type": "application/json; charset=utf-8" }, payload: "{}" });
    expect(seeded.statusCode).toBe(200);
  });

  it("the counter's seed and close refuse unknown fields and non-objects like its other routes (nothing seeded or closed)", async () => {
    const b = await world.harness(new CounterServer());
    for (const payload of [{ bogus: 1 }, [1, 2], "seed"]) {
      const reply = await b.app.inject({ method: "POST", url: "/ng-rollout/r1/seed_session", headers: { "content-type": "application/json" }, payload: JSON.stringify(payload) });
      expect(reply.json().error?.code, JSON.stringify(payload)).toBe("invalid_request");
    }
    expect(b.kind.readiness().counts.sessions).toBe(0);
    const seeded = await b.post("/ng-rollout/r1/seed_session", { task: { any: ["json"] } }); // what the environment sends
    const cookie = String(seeded.headers["set-cookie"]).split(";")[0]!;
    expect((await b.post("/ng-rollout/r1/close_session", { bogus: 1 }, cookie)).json().error?.code).toBe("invalid_request");
    expect(b.kind.readiness().counts.sessions).toBe(1);
    expect((await b.post("/ng-rollout/r1/close_session", {}, cookie)).statusCode).toBe(200);
    expect(b.kind.readiness().counts.sessions).toBe(0);
  });

  it("the doc names the code a body over 1 MiB really gets (413 payload_too_large)", async () => {
    const b = await world.harness(new CounterServer());
    const reply = await b.post("/ng-rollout/r1/seed_session", { pad: "x".repeat(1_100_000) });
    expect(reply.json().error.code).toBe("payload_too_large");
    const doc = await readFile("docs/resources.md", "utf8");
    const sentence = doc.slice(doc.indexOf("Request bodies are JSON"), doc.indexOf("before a route runs"));
    expect(sentence).toContain("payload_too_large");
  });
});
