import { describe, expect, it } from "vitest";
import { verifyCalls, type BackendCall } from "../../../coordinator/local/demo.js";

const call = (capture_key: string, model_call_id: string, message_count: number, fields: Partial<BackendCall> = {}): BackendCall => ({
  capture_key,
  model_call_id,
  continued_from: null,
  message_count,
  delivered: true,
  aborted: false,
  tokens_emitted: 3,
  ...fields,
});

describe("the demo's verdict on backend calls", () => {
  it("counts a delivered call made again from scratch as repeated", () => {
    const calls = [call("r1", "mc-1", 2), call("r1", "mc-2", 4), call("r1-a1", "mc-3", 4)];
    expect(verifyCalls(calls)).toMatchObject({ delivered: 3, repeated: 1 });
  });

  it("does not count the continuation of a cut call (it reuses the cut prefix) as repeated", () => {
    // The crash checkpoint cut mc-2: the backend finished writing it, the Gym never got it.
    const calls = [call("r1", "mc-1", 2), call("r1", "mc-2", 4, { tokens_emitted: 1 }), call("r1-a1", "mc-3", 4, { continued_from: "mc-2" })];
    expect(verifyCalls(calls)).toMatchObject({ delivered: 3, repeated: 0, keptByContinuation: 2 });
  });

  it("a continuation naming another call than the delivered one is still a repeat", () => {
    const calls = [call("r1", "mc-1", 2), call("r1", "mc-2", 4), call("r1-a1", "mc-3", 4, { continued_from: "mc-1" })];
    expect(verifyCalls(calls).repeated).toBe(1);
  });
});
