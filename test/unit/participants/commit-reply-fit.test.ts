import { describe, expect, it } from "vitest";
import { fitCommitReply } from "../../../participants/control-plane/commit-reply.js";
import { canonicalDigest, type CommitReply } from "../../../protocol/index.js";

// fitCommitReply keeps the episode list when "the whole reply fits" its budget: a reply of exactly
// `budget` bytes fits (one control message may be max_payload bytes long), one byte more does not.
const reply = (ids: string[]) =>
  ({ phase: "committed", manifest: {}, manifest_path: "m.json", manifest_sha256: "0".repeat(64), episode_ids: ids, extras: {} }) as unknown as CommitReply;

describe("a commit reply fitted to its budget", () => {
  it("keeps the list at exactly the budget and leaves it out (count + digest) one byte under", () => {
    const whole = reply(["r1:0", "r2:0"]);
    const size = Buffer.byteLength(JSON.stringify(whole));
    expect(fitCommitReply(whole, size)).toBe(whole);
    const fitted = fitCommitReply(whole, size - 1);
    expect(fitted).toMatchObject({ episode_ids: null, episode_count: 2, episode_ids_sha256: canonicalDigest(["r1:0", "r2:0"]) });
  });
});
