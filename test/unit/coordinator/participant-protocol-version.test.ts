import { describe, expect, it } from "vitest";
import { systemClock } from "../../../coordinator/engine/clock.js";
import { ParticipantClient } from "../../../coordinator/engine/participant-client.js";
import type { ParticipantTransport } from "../../../coordinator/engine/transport.js";
import { PROTOCOL_VERSION } from "../../../protocol/index.js";

// A participant of another protocol version answering a status (the only reply that names its
// version) is told apart from a broken one: internal_error naming both versions, never a list of
// unrecognized keys, and never a reply read as if it were this version's.
const answering = (reply: unknown): ParticipantTransport => ({ request: () => Promise.resolve(JSON.stringify(reply)) });

const status = {
  kind: "agent",
  instance: "a1",
  phase: "idle",
  checkpoint_id: null,
  lease_expires_at: null,
  epoch: 1,
  retired_rollouts: 0,
  report: { ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: [] },
  protocol_version: PROTOCOL_VERSION,
  extras: {},
};
const NEWER = PROTOCOL_VERSION + 1;
const namesVersions = expect.stringMatching(new RegExp(`agent/a1.*protocol version ${NEWER}\\b.*\\b${PROTOCOL_VERSION}\\b`));

async function statusOutcome(reply: unknown) {
  const client = new ParticipantClient({ transport: answering(reply), deployment: "d", token: "t", clock: systemClock, slackMs: 100 });
  return client.call({ kind: "agent", instance: "a1" }, "status", {}, Date.now() + 5000);
}

describe("a status reply of another protocol version", () => {
  it("with fields this version lacks: internal_error naming both versions, not the unknown keys", async () => {
    const outcome = await statusOutcome({ ...status, protocol_version: NEWER, added_later: true });
    expect(outcome).toMatchObject({ ok: false, code: "internal_error", detail: namesVersions });
    expect(outcome.ok ? "" : outcome.detail).not.toContain("Unrecognized");
  });

  it("in this version's shape: refused all the same, never read as this version's", async () => {
    expect(await statusOutcome({ ...status, protocol_version: NEWER })).toMatchObject({ ok: false, code: "internal_error", detail: namesVersions });
    expect(await statusOutcome(status)).toMatchObject({ ok: true });
  });
});
