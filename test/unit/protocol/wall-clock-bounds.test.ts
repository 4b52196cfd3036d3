import type { NatsConnection } from "@nats-io/transport-node";
import { TimeoutError } from "@nats-io/transport-node";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { awaitBucketStore } from "../../../protocol/kv-store-ready.js";
import { connectNatsWithin, type FirstConnectFailure } from "../../../protocol/nats-first-connect.js";
import { closedPort } from "../../support/ports.js";

// Both bound how long this process keeps trying (a duration within it). Before, the bound was a
// Date.now() instant: a wall clock stepped back (NTP, a VM resume) kept them trying for the step's
// length (an hour here) instead of withinMs; one stepped ahead gave up at once.
let offset = 0;
beforeEach(() => {
  offset = 0;
  const wall = Date.now.bind(Date);
  vi.spyOn(Date, "now").mockImplementation(() => wall() + offset);
});
afterEach(() => vi.restoreAllMocks());

/** `work`'s outcome, or "still trying" once `ms` of real time passed. */
function within<T>(work: Promise<T>, ms: number): Promise<T | "still trying"> {
  return Promise.race([work, new Promise<"still trying">((resolve) => setTimeout(() => resolve("still trying"), ms).unref())]);
}

describe("bounds on the monotonic clock", () => {
  it("awaitBucketStore gives up after withinMs although the wall clock stepped back while it probed", async () => {
    let probes = 0;
    const nc = {
      request: async (subject: string) => {
        if (subject.startsWith("$JS.API.STREAM.INFO.")) return { json: () => ({ config: { allow_direct: true } }) };
        if (++probes === 1) offset = -3_600_000; // stepped back during the first probe
        throw new TimeoutError(); // a stream without its store leaves direct gets unanswered
      },
    } as unknown as NatsConnection;
    expect(await within(awaitBucketStore(nc, "b", 300), 5_000)).toBe("unprovable");
  });

  it("connectNatsWithin gives up after withinMs although the wall clock stepped back after its first try", async () => {
    const port = await closedPort();
    const failure: FirstConnectFailure = { unreachable: "unreachable", consequence: "test" };
    const log = { warn: () => void (offset = -3_600_000) }; // said once, after the first failed try
    const connecting = connectNatsWithin({ servers: `nats://127.0.0.1:${port}`, inboxPrefix: "_INBOX_test" }, 600, failure, log, 100);
    const outcome = await within(
      connecting.then(
        () => "connected",
        (error: { code?: string }) => error.code,
      ),
      5_000,
    );
    expect(outcome).toBe("unreachable");
  });
});
