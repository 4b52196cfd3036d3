import { describe, expect, it } from "vitest";
import { systemClock } from "../../../coordinator/engine/clock.js";
import { ParticipantClient } from "../../../coordinator/engine/participant-client.js";
import type { ParticipantTransport } from "../../../coordinator/engine/transport.js";
import { MANIFEST_SCHEMA_VERSION, PROTOCOL_VERSION } from "../../../protocol/index.js";

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

// A commit reply carries the participant's manifest: one of another schema_version (a participant
// built with another manifest format) is named as such, never a list of zod complaints.
describe("a commit reply whose manifest is of another schema_version", () => {
  const sha = "a".repeat(64);
  const manifest = { schema_version: MANIFEST_SCHEMA_VERSION, kind: "agent", instance: "a1", checkpoint_id: "c1", records_file: `records-${sha}.jsonl`, records_sha256: sha, record_count: 0, created_at: 1, extra: {} };
  const commit = { phase: "committed", manifest, manifest_path: "gym/agent/a1/manifest.json", manifest_sha256: sha, episode_ids: [], extras: {} };
  async function commitOutcome(reply: unknown) {
    const client = new ParticipantClient({ transport: answering(reply), deployment: "d", token: "t", clock: systemClock, slackMs: 100 });
    const deadline = Date.now() + 5000;
    return client.call({ kind: "agent", instance: "a1" }, "commit", { checkpoint_id: "c1", deadline_ts: deadline / 1000, epoch: 1, checkpoint_dir: "/tmp/c1", episode_ids: null, stop: false }, deadline);
  }

  it("internal_error naming both schema versions, also with fields this version lacks", async () => {
    const newer = MANIFEST_SCHEMA_VERSION + 1;
    const names = expect.stringMatching(new RegExp(`agent/a1.*schema_version ${newer} \\(written by a newer gym-ckpt\\).*schema_version ${MANIFEST_SCHEMA_VERSION} only`));
    for (const other of [{ ...manifest, schema_version: newer }, { ...manifest, schema_version: newer, shards: 2 }]) {
      const outcome = await commitOutcome({ ...commit, manifest: other });
      expect(outcome).toMatchObject({ ok: false, code: "internal_error", detail: names });
      expect(outcome.ok ? "" : outcome.detail).not.toMatch(/Unrecognized|Invalid input/);
    }
    expect(await commitOutcome(commit)).toMatchObject({ ok: true });
  });
});
