import type { KV } from "@nats-io/kv";
import { afterEach, describe, expect, it, vi } from "vitest";
import { systemClock } from "../../../coordinator/engine/clock.js";
import { WatchedMemberRegistry } from "../../../coordinator/membership/watched-member-registry.js";

/** A watch that delivers nothing until stopped. */
function quietWatch() {
  let end!: () => void;
  const ended = new Promise<void>((resolve) => (end = resolve));
  return {
    stop: () => end(),
    async *[Symbol.asyncIterator]() {
      await ended;
    },
  };
}

afterEach(() => vi.restoreAllMocks());

// Coordinators that lost their watch in one NATS restart must not all reopen it at the same instants.
describe("membership watch reopen", () => {
  it("waits a jittered pause (equal jitter, drawn from the clock's random source) after a failed reopen", async () => {
    let calls = 0;
    let reopened!: () => void;
    const secondReopen = new Promise<void>((resolve) => (reopened = resolve));
    const kv = {
      watch: async () => {
        calls += 1;
        if (calls === 1) throw new Error("JetStream not available");
        reopened();
        return quietWatch();
      },
    } as unknown as KV;
    const delays: number[] = [];
    const realSetTimeout = globalThis.setTimeout;
    vi.spyOn(globalThis, "setTimeout").mockImplementation(((fn: () => void, ms?: number) => {
      delays.push(ms ?? 0);
      return realSetTimeout(fn, 0);
    }) as typeof setTimeout);
    const registry = new WatchedMemberRegistry(kv, undefined, { ...systemClock, random: () => 0 });
    try {
      // The first reopen fails (its grown pause 200 ms), the second follows a watch.
      void (registry as unknown as { rewatch(): Promise<void> }).rewatch();
      await secondReopen;
      expect(delays).toEqual([100]);
    } finally {
      registry.stop();
    }
  });
});
