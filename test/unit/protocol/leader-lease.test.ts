import { describe, expect, it } from "vitest";
import { decodeLeaseValue, encodeLeaseValue, leaseEpochFloor } from "../../../protocol/index.js";

const value = (epoch: number | null) => encodeLeaseValue({ id: "coord-b", term: "0123456789abcdef", serving: true, epoch, at: 1 });

describe("the leader lease's value and the epoch floor a starting participant takes from it", () => {
  it("decodes what the coordinator writes, and an older coordinator's value without term, serving or epoch", () => {
    expect(decodeLeaseValue(value(7))).toEqual({ id: "coord-b", term: "0123456789abcdef", serving: true, epoch: 7 });
    expect(decodeLeaseValue(value(null))).toMatchObject({ epoch: null });
    expect(decodeLeaseValue(JSON.stringify({ id: "old", at: 1 }))).toEqual({ id: "old", term: undefined, serving: undefined, epoch: undefined });
    expect(decodeLeaseValue(JSON.stringify({ id: "odd", epoch: -3 }))?.epoch).toBeUndefined();
    expect(decodeLeaseValue("not json")).toBeUndefined();
    expect(decodeLeaseValue(JSON.stringify({ term: "t" }))).toBeUndefined();
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
