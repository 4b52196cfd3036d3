import { afterEach, describe, expect, it } from "vitest";
import { HttpControllerClient, MAX_CONTROLLER_REPLY_BYTES, MAX_READYZ_REPLY_BYTES } from "../../coordinator/client/http-controller-client.js";
import { startOversizedBody, type OversizedBodyServer } from "../support/oversized-body.js";
import { waitUntil } from "../support/wait-until.js";

// The HTTP controller client reads reply bodies up to a limit, cancelling the rest: something in
// front of the coordinator answering with an endless body must not grow the controller's process.
let server: OversizedBodyServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

describe("HTTP controller client reply size", () => {
  it("an op reply past the client's limit is outcome_unknown naming the limit, its stream cancelled", async () => {
    const limit = 64 * 1024 * 1024;
    server = await startOversizedBody(2 * limit);
    const client = new HttpControllerClient({ baseUrl: server.url, token: "t", maxReplyBytes: limit });
    await expect(client.call("list", {})).rejects.toMatchObject({ code: "outcome_unknown", message: expect.stringContaining(`${limit} bytes`) });
    await server.cancelled;
  });

  it("by default, no reply a string can hold is refused: the limit is V8's longest string", () => {
    // Room for the longest episode lists the API answers in full over HTTP, several participants over.
    expect(MAX_CONTROLLER_REPLY_BYTES).toBeGreaterThan(8 * 26 * 1024 * 1024);
  });

  it("a /readyz reply past MAX_READYZ_REPLY_BYTES counts as a failed check (the op ends outcome_unknown), its stream cancelled", async () => {
    let received = 0;
    server = await startOversizedBody(256 * MAX_READYZ_REPLY_BYTES, {
      // The op itself is never answered; only /readyz gets the oversized body.
      route: (req) => req.url !== "/readyz" && (received += 1) > 0,
    });
    // The check's period is also each /readyz fetch's timeout: 1 s lets an uncapped read take the
    // whole body in time, so only the cap can fail the check.
    const client = new HttpControllerClient({ baseUrl: server.url, token: "t", readyCheckMs: 1_000 });
    let settled: unknown = "pending";
    void client.checkpoint({ checkpoint_id: "h1", episode_ids: [] }).then(
      (reply) => (settled = reply),
      (error: unknown) => (settled = error),
    );
    await waitUntil(() => settled !== "pending", "the op to end once /readyz keeps failing", 12_000);
    expect(received).toBe(1);
    expect(settled).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("stopped being the ready leader") });
    await server.cancelled;
  });

  // 504: a proxy's timeout fails the check unread; its 502 and 503 are read up to the cap (below).
  it("a refused /readyz (504) is not read whole either: its body is cancelled, the check failed", async () => {
    server = await startOversizedBody(256 * MAX_READYZ_REPLY_BYTES, {
      status: 504,
      route: (req) => req.url !== "/readyz",
    });
    // As above: 1 s lets an uncapped read take each 16 MiB body whole before the fetch's timeout.
    const client = new HttpControllerClient({ baseUrl: server.url, token: "t", readyCheckMs: 1_000 });
    let settled: unknown = "pending";
    void client.checkpoint({ checkpoint_id: "h2", episode_ids: [] }).then(
      (reply) => (settled = reply),
      (error: unknown) => (settled = error),
    );
    await waitUntil(() => settled !== "pending", "the op to end once /readyz keeps failing", 12_000);
    expect(settled).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("stopped being the ready leader") });
    expect(server.completed()).toBe(0);
    await server.cancelled;
  }, 20_000);

  it("a proxy's 503 on /readyz, without the API's body, is read only up to the cap and does not end the op (a stop in progress)", async () => {
    let checks = 0;
    server = await startOversizedBody(256 * MAX_READYZ_REPLY_BYTES, {
      status: 503,
      route: (req) => req.url !== "/readyz" || (checks += 1) < 0,
    });
    const client = new HttpControllerClient({ baseUrl: server.url, token: "t", readyCheckMs: 1_000 });
    let settled: unknown = "pending";
    void client.checkpoint({ checkpoint_id: "h3", episode_ids: [] }).then(
      (reply) => (settled = reply),
      (error: unknown) => (settled = error),
    );
    // Three times the two failed checks that ended the wait before.
    await waitUntil(() => checks >= 6 || settled !== "pending", "six readiness checks", 15_000);
    expect(settled).toBe("pending");
    expect(server.completed()).toBe(0);
    await server.cancelled;
  }, 20_000);
});
