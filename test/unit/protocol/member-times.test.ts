import { describe, expect, it } from "vitest";
import { MemberSchema } from "../../../protocol/index.js";

// A participant names another process's announcement times in its refusals and logs
// (`new Date(heartbeat_at * 1000).toISOString()` when it claims its name, `started_at` when it
// finds its name taken over). toISOString throws a RangeError past ±8.64e15 ms, so an
// announcement whose times no Date holds (a corrupt value, a foreign writer's nanoseconds) made
// the claim throw instead of taking the gone predecessor's entry over, and made `lose()` throw
// before it told the owner, leaving the process serving a name another process holds.
const member = { kind: "agent", instance: "a1", incarnation: "i1", started_at: 1_765_000_000, heartbeat_at: 1_765_000_005, protocol_version: 1 };

describe("membership announcement times", () => {
  it("takes Unix seconds", () => {
    expect(MemberSchema.parse(member)).toEqual(member);
    expect(MemberSchema.safeParse({ ...member, started_at: 0, heartbeat_at: 1_765_000_005.123 }).success).toBe(true);
  });

  it("refuses times no Date can hold, and negative ones, so every accepted time formats", () => {
    for (const field of ["started_at", "heartbeat_at"] as const) {
      for (const bad of [1.765e18, 1e300, -1, -1e300]) {
        expect(MemberSchema.safeParse({ ...member, [field]: bad }).success, `${field}: ${bad}`).toBe(false);
      }
    }
    // The largest accepted instant still formats.
    const latest = MemberSchema.parse({ ...member, started_at: 8.64e12, heartbeat_at: 8.64e12 });
    expect(() => new Date(latest.heartbeat_at * 1000).toISOString()).not.toThrow();
  });
});
