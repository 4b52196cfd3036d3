import { describe, expect, it } from "vitest";
import { formatCoordinatorIdHeader, parseCoordinatorEpochHeader, parseCoordinatorIdHeader } from "../../../protocol/index.js";

// A configured coordinator_id may hold what no header value can: the id header carries it percent-encoded.
describe("the Gym-Coordinator-Id header of /readyz", () => {
  it("reads back any coordinator id the coordinator writes, in a value a header can carry", () => {
    for (const id of ["coord-a", "host-1234-ab12cd", "kö ordinator", "a\nb", "100%", "协调器"]) {
      const value = formatCoordinatorIdHeader(id);
      expect([id, /^[\x21-\x7e]+$/.test(value), parseCoordinatorIdHeader(value)]).toEqual([id, true, id]);
    }
  });

  it("names no coordinator for an absent or undecodable value (a coordinator before the header)", () => {
    for (const value of [undefined, null, "", "%E0%A4%A", "%zz"]) expect(parseCoordinatorIdHeader(value), String(value)).toBeUndefined();
  });

  it("reads the epoch header's term as a number, none when absent (no term held) or not digits", () => {
    expect([parseCoordinatorEpochHeader("9"), parseCoordinatorEpochHeader("123456789012")]).toEqual([9, 123456789012]);
    for (const value of [undefined, null, "", "-1", "1.5", "9 ", "0x10", "1234567890123456"]) expect(parseCoordinatorEpochHeader(value), String(value)).toBeUndefined();
  });
});
