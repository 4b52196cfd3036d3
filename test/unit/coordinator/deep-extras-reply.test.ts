import { describe, expect, it } from "vitest";
import { systemClock } from "../../../coordinator/engine/clock.js";
import { ParticipantClient } from "../../../coordinator/engine/participant-client.js";
import type { ParticipantTransport } from "../../../coordinator/engine/transport.js";
import { MAX_JSON_DEPTH } from "../../../protocol/index.js";

// docs/protocol.md said a reply whose extras nest deeper than MAX_JSON_DEPTH "is refused
// invalid_request"; the participant sends it, and the coordinator reads it as it reads any reply
// not in its op's shape (docs/api.md): that participant's outcome is internal_error, "invalid <op> reply".
const nested = (levels: number): unknown => {
  let value: unknown = 1;
  for (let i = 0; i < levels; i++) value = [value];
  return value;
};
const statusReply = (extras: Record<string, unknown>) =>
  JSON.stringify({
    kind: "model",
    instance: "m1",
    phase: "idle",
    checkpoint_id: null,
    lease_expires_at: null,
    epoch: 0,
    retired_rollouts: 0,
    report: { ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: [] },
    protocol_version: 1,
    extras,
  });
const answering = (reply: string): ParticipantTransport => ({ request: () => Promise.resolve(reply) });

describe("a participant reply whose extras nest too deep", () => {
  it("is that participant's internal_error (an invalid reply), naming extras; one within the limit is read", async () => {
    const call = (reply: string) =>
      new ParticipantClient({ transport: answering(reply), deployment: "d", token: "t", clock: systemClock, slackMs: 100 }).call({ kind: "model", instance: "m1" }, "status", {}, Date.now() + 5000);
    expect(await call(statusReply({ cuts: nested(MAX_JSON_DEPTH) }))).toMatchObject({
      ok: false,
      code: "internal_error",
      detail: expect.stringMatching(/model\/m1: invalid status reply: extras: .*nested at most 128 levels/),
    });
    expect(await call(statusReply({ cuts: nested(MAX_JSON_DEPTH - 1) }))).toMatchObject({ ok: true });
  });
});
