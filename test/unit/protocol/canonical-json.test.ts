import { describe, expect, it } from "vitest";
import { CheckpointError, canonicalDigest, canonicalJson } from "../../../protocol/index.js";

describe("canonicalJson", () => {
  it("a value whose JSON is longer than any string V8 makes is payload_too_large, not V8's bare RangeError (internal_error)", () => {
    // What JSON.stringify throws past the longest string (a 256 MiB generation body of numbers such
    // as 9E20, 21 digits each as JSON), without building 512 MiB.
    const huge = { messages: [{ content: { toJSON: () => { throw new RangeError("Invalid string length"); } } }] };
    for (const run of [() => canonicalJson(huge), () => canonicalDigest(huge)]) {
      let thrown: unknown;
      try {
        run();
      } catch (error) {
        thrown = error;
      }
      expect(thrown).toBeInstanceOf(CheckpointError);
      expect(thrown).toMatchObject({ code: "payload_too_large", message: expect.stringContaining("longer than the longest string") });
    }
  });

  it("other failures are passed on as they are", () => {
    const cyclic: Record<string, unknown> = {};
    cyclic.self = { toJSON: () => { throw new TypeError("not JSON"); } };
    expect(() => canonicalJson(cyclic)).toThrow(TypeError);
  });
});
