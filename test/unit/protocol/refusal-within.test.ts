import { describe, expect, it } from "vitest";
import { CheckpointError, ErrorReplySchema } from "../../../protocol/index.js";
import { refusalWithin } from "../../../protocol/nats-reply.js";

/** A refusal's reply fitted to a NATS server's small max_payload: same code, detail cut, never past the limit. */
describe("refusalWithin", () => {
  it("returns the refusal's own reply when it fits", () => {
    const refusal = new CheckpointError("invalid_request", "short");
    expect(refusalWithin(refusal, 1024)).toBe(JSON.stringify(refusal.toReply()));
  });

  it.each([200, 333, 512, 1000])("cuts a long detail (multi-byte characters, emoji) to fit %i bytes, keeping the code and saying why", (limit) => {
    const detail = "é€😀 blocker ".repeat(200);
    const fitted = refusalWithin(new CheckpointError("prepare_incomplete", detail), limit)!;
    expect(Buffer.byteLength(fitted)).toBeLessThanOrEqual(limit);
    const reply = ErrorReplySchema.parse(JSON.parse(fitted));
    expect(reply.error.code).toBe("prepare_incomplete");
    expect(reply.error.detail).toMatch(new RegExp(`… \\(${detail.length} characters; the NATS server's max_payload is ${limit} bytes\\)$`));
    const kept = reply.error.detail.slice(0, reply.error.detail.indexOf("… ("));
    expect(detail.startsWith(kept)).toBe(true);
    // No lone half of a surrogate pair.
    expect(fitted).not.toMatch(/\\ud[89ab]/i);
  });

  it("empties the detail when not even the note fits, and gives up below an empty refusal", () => {
    const refusal = new CheckpointError("prepare_incomplete", "x".repeat(500));
    const empty = JSON.stringify({ error: { code: "prepare_incomplete", detail: "" } });
    expect(refusalWithin(refusal, Buffer.byteLength(empty) + 10)).toBe(empty);
    expect(refusalWithin(refusal, Buffer.byteLength(empty) - 1)).toBeUndefined();
  });
});
