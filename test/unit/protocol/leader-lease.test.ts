import { describe, expect, it } from "vitest";
import { PROTOCOL_VERSION, decodeLeaseValue, encodeLeaseValue, leaderOfOtherVersion, leaseEpochFloor } from "../../../protocol/index.js";

const value = (epoch: number | null) => encodeLeaseValue({ id: "coord-b", term: "0123456789abcdef", serving: true, epoch, at: 1 });

describe("the leader lease's value and the epoch floor a starting participant takes from it", () => {
  it("decodes what the coordinator writes, and an older coordinator's value without term, serving or epoch", () => {
    expect(decodeLeaseValue(value(7))).toEqual({ id: "coord-b", term: "0123456789abcdef", serving: true, epoch: 7, protocolVersion: PROTOCOL_VERSION });
    expect(decodeLeaseValue(value(null))).toMatchObject({ epoch: null });
    expect(decodeLeaseValue(JSON.stringify({ id: "old", at: 1 }))).toEqual({ id: "old", term: undefined, serving: undefined, epoch: undefined, protocolVersion: undefined });
    expect(decodeLeaseValue(JSON.stringify({ id: "odd", epoch: -3 }))?.epoch).toBeUndefined();
    expect(decodeLeaseValue("not json")).toBeUndefined();
    expect(decodeLeaseValue(JSON.stringify({ term: "t" }))).toBeUndefined();
  });

  it("names the writer's protocol version; a leader of another version is named, one of this version or naming none (an older v1 coordinator's) is not", () => {
    expect(JSON.parse(value(7))).toMatchObject({ protocol_version: PROTOCOL_VERSION });
    const v1Older = { id: "old", term: "t", serving: true, epoch: 3, at: 1 };
    expect(decodeLeaseValue(JSON.stringify(v1Older))).toMatchObject({ id: "old", epoch: 3, protocolVersion: undefined });
    expect(leaderOfOtherVersion(decodeLeaseValue(JSON.stringify(v1Older)))).toBeUndefined();
    expect(leaderOfOtherVersion(decodeLeaseValue(value(7)))).toBeUndefined();
    expect(leaderOfOtherVersion(null)).toBeUndefined();
    const newer = decodeLeaseValue(JSON.stringify({ ...v1Older, id: "coord-v2", protocol_version: PROTOCOL_VERSION + 1 }));
    expect(leaderOfOtherVersion(newer)).toContain(`coordinator coord-v2, which speaks protocol version ${PROTOCOL_VERSION + 1} (a newer gym-ckpt)`);
    // Still read as a lease whatever its version: its epoch fences as any other.
    expect(leaseEpochFloor(5, { revision: 5, value: JSON.stringify({ ...v1Older, protocol_version: PROTOCOL_VERSION + 1 }) })).toBe(3);
  });

  it("is the epoch the key names, the sequence before the create, the last sequence when nobody leads, else 0", () => {
    expect(leaseEpochFloor(12, { revision: 12, value: value(9) })).toBe(9); // renewed since: its revision is past the epoch
    // Below the create: the campaign's own probe must not find its revision in use.
    expect(leaseEpochFloor(9, { revision: 9, value: value(null) })).toBe(8);
    expect(leaseEpochFloor(1, { revision: 1, value: value(null) })).toBe(0);
    expect(leaseEpochFloor(15, null)).toBe(15);
    expect(leaseEpochFloor(0, null)).toBe(0);
    expect(leaseEpochFloor(12, { revision: 12, value: JSON.stringify({ id: "old", at: 1 }) })).toBe(0);
    expect(leaseEpochFloor(12, { revision: 12, value: "garbage" })).toBe(0);
  });
});
