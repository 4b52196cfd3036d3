import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { systemClock } from "../../../coordinator/engine/clock.js";
import { ABSENT_PROBES, probePresence, type ProcessGoneFailure } from "../../../coordinator/engine/presence-probe.js";
import { NoRespondersFailure, RequestTimeoutFailure, type ParticipantTransport } from "../../../coordinator/engine/transport.js";

type Answer = "nobody" | "timeout" | "reply";
const EVERY_MS = 100;

/** Answers the probes from a script (then "reply" for ever), recording the subjects asked. */
function scripted(script: Answer[]): ParticipantTransport & { asked: string[] } {
  const asked: string[] = [];
  return {
    asked,
    request(subject) {
      asked.push(subject);
      const answer = script.shift() ?? "reply";
      if (answer === "nobody") return Promise.reject(new NoRespondersFailure(subject));
      if (answer === "timeout") return Promise.reject(new RequestTimeoutFailure(subject, EVERY_MS));
      return Promise.resolve("{}");
    },
  };
}

beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

function probe(transport: ParticipantTransport) {
  const gone: ProcessGoneFailure[] = [];
  const stop = probePresence("s.status", "agent/a1", { transport, clock: systemClock, token: "t", everyMs: EVERY_MS }, (failure) => gone.push(failure));
  return { gone, stop };
}

describe("probePresence", () => {
  it("sends nothing before the first period, then calls gone only after ABSENT_PROBES no-responders in a row", async () => {
    const transport = scripted(Array(ABSENT_PROBES).fill("nobody"));
    const { gone } = probe(transport);
    await vi.advanceTimersByTimeAsync(EVERY_MS - 1);
    expect(transport.asked).toEqual([]);
    await vi.advanceTimersByTimeAsync((ABSENT_PROBES - 1) * EVERY_MS);
    expect(transport.asked).toHaveLength(ABSENT_PROBES - 1);
    expect(gone).toEqual([]);
    await vi.advanceTimersByTimeAsync(EVERY_MS);
    expect(gone).toHaveLength(1);
    expect(gone[0]!.message).toBe(`agent/a1 left NATS while the try waited (no responders on its status subject in ${ABSENT_PROBES} probes ${EVERY_MS} ms apart)`);
    expect(gone[0]).toBeInstanceOf(RequestTimeoutFailure); // an unknown outcome: the try is sent again
    // Done once gone: no more probes.
    await vi.advanceTimersByTimeAsync(10 * EVERY_MS);
    expect(transport.asked).toHaveLength(ABSENT_PROBES);
  });

  it("starts the count again after a reply or a timed-out probe (a process too busy to answer is still there)", async () => {
    const nobodies: Answer[] = Array(ABSENT_PROBES - 1).fill("nobody");
    const transport = scripted([...nobodies, "reply", ...nobodies, "timeout", ...nobodies, "nobody"]);
    const { gone } = probe(transport);
    await vi.advanceTimersByTimeAsync((3 * ABSENT_PROBES - 1) * EVERY_MS);
    expect(transport.asked).toHaveLength(3 * ABSENT_PROBES - 1);
    expect(gone).toEqual([]);
    await vi.advanceTimersByTimeAsync(EVERY_MS);
    expect(transport.asked).toHaveLength(3 * ABSENT_PROBES);
    expect(gone).toHaveLength(1);
    expect(transport.asked.every((subject) => subject === "s.status")).toBe(true);
  });

  it("stops probing when stopped, and a probe answered after that calls nothing", async () => {
    let answer!: (error: Error) => void;
    const transport: ParticipantTransport & { asked: number } = {
      asked: 0,
      request() {
        transport.asked++;
        return new Promise<string>((_, reject) => (answer = reject));
      },
    };
    const { gone, stop } = probe(transport);
    await vi.advanceTimersByTimeAsync(EVERY_MS);
    expect(transport.asked).toBe(1);
    stop();
    answer(new NoRespondersFailure("s.status"));
    await vi.advanceTimersByTimeAsync(10 * EVERY_MS);
    expect(transport.asked).toBe(1);
    expect(gone).toEqual([]);
  });
});
