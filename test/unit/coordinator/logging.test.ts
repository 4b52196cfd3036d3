import { Writable } from "node:stream";
import { describe, expect, it } from "vitest";
import { createLogger } from "../../../coordinator/telemetry/logger.js";

describe("coordinator logs", () => {
  it("are JSON and redact tokens, passwords and Authorization headers", () => {
    const lines: string[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        lines.push(chunk.toString());
        done();
      },
    });
    const logger = createLogger("info", sink);
    logger.child({ checkpoint_id: "c1" }).child({ kind: "model", instance: "m" }).info(
      { token: "t0ken", config: { token: "t1", nats: { pass: "pw1" } }, headers: { authorization: "Bearer abc" }, request: { authorization: "Bearer def" } },
      "hello",
    );
    const record = JSON.parse(lines[0]!) as Record<string, any>;
    expect(record.msg).toBe("hello");
    expect(record.checkpoint_id).toBe("c1");
    expect(record.kind).toBe("model");
    const text = lines.join("");
    for (const secret of ["t0ken", "t1", "pw1", "abc", "def"]) expect(text).not.toContain(secret);
  });
});
