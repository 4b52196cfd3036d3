import { expect, it } from "vitest";
import { assertAllTookPart } from "../../../bench/coordinator-checkpoint.js";
import type { CtlReplyOf } from "../../../protocol/index.js";

/**
 * The coordinator benchmark times a checkpoint against a floor sent to all N responders. A member
 * the registry stopped listing (its entry expired: the registry drops one MEMBER_TTL_MS after its
 * last heartbeat) is left out of a checkpoint without a refusal: such a checkpoint, smaller than
 * the floor, must stop the run instead of being timed.
 */
const members = [
  { kind: "environment", instance: "p0" },
  { kind: "model", instance: "p1" },
  { kind: "agent", instance: "p2" },
  { kind: "resources", instance: "p3" },
] as const;

function reply(participants: number, resumeFailures = 0): CtlReplyOf<"checkpoint"> {
  return {
    checkpoint_id: "c-1",
    epoch: 1,
    checkpoint_dir: "/tmp/root/c-1",
    manifest_path: "/tmp/root/c-1/checkpoint.json",
    published_at: 1,
    participants,
    restarts: [],
    restart_count: 0,
    restarts_sha256: null,
    deleted: [],
    resume_failures: Array.from({ length: resumeFailures }, () => ({ kind: "agent" as const, instance: "p2", code: "unreachable" as const, detail: "no responders" })),
    timings_ms: { prepare: 1, commit: 1, publish: 1, resume: 1 },
  } as unknown as CtlReplyOf<"checkpoint">;
}

it("a checkpoint with every member passes", () => {
  expect(assertAllTookPart({ members: [...members] }, reply(4)).participants).toBe(4);
});

it("a checkpoint that left a member out stops the run", () => {
  expect(() => assertAllTookPart({ members: [...members] }, reply(3))).toThrow(/3 of 4 participants/);
});

it("a checkpoint whose resume failed somewhere stops the run", () => {
  expect(() => assertAllTookPart({ members: [...members] }, reply(4, 1))).toThrow(/1 failed to resume/);
});
