import { describe, expect, it } from "vitest";
import { formatSentAt, parseSentAt } from "../../../protocol/index.js";

// Gym-Sent-At is advisory: whatever cannot be read as a plausible send time is ignored (undefined), never an error.
describe("the Gym-Sent-At header", () => {
  it("reads back what the coordinator writes", () => {
    expect(formatSentAt(1_700_000_000_123.9)).toBe("1700000000123");
    expect(parseSentAt(formatSentAt(1_700_000_000_123))).toBe(1_700_000_000_123);
  });

  it("ignores an absent, non-digit, overlong or implausible value", () => {
    for (const value of [undefined, "", " 1700000000000", "1700000000000 ", "+1700000000000", "-1700000000000", "1.7e12", "1700000000000.5", "0x18bcfe56800", "１７００", "17000000000000000"]) {
      expect(parseSentAt(value), String(value)).toBeUndefined();
    }
    expect(parseSentAt("0")).toBeUndefined(); // 1970: a garbled value, not decades of skew
    expect(parseSentAt(String(Date.UTC(2000, 0, 1) - 1))).toBeUndefined();
    expect(parseSentAt(String(Date.UTC(2000, 0, 1)))).toBe(Date.UTC(2000, 0, 1));
    expect(parseSentAt(String(Date.UTC(2200, 0, 1)))).toBeUndefined();
  });
});
