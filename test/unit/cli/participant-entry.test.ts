import { describe, expect, it } from "vitest";
import { exitCodeOf } from "../../../coordinator/local/participant-entry.js";

describe("a participant program's exit as the CLI's exit code", () => {
  it("passes its own code through and maps a signal to 128 + its number", () => {
    expect(exitCodeOf(0, null)).toBe(0);
    expect(exitCodeOf(2, null)).toBe(2);
    expect(exitCodeOf(null, "SIGINT")).toBe(130);
    expect(exitCodeOf(null, "SIGKILL")).toBe(137);
    expect(exitCodeOf(null, "SIGTERM")).toBe(143);
    expect(exitCodeOf(null, null)).toBe(1);
  });
});
