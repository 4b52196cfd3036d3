import { existsSync } from "node:fs";
import { dirname } from "node:path";
import { afterEach, describe, expect, it, vi } from "vitest";

/**
 * runDemo on an abort (the demo's Ctrl-C) stops waiting for the run and cleans up at once, while the
 * run itself goes on until its next check. Every start the run makes must check the abort first:
 * the clean-up has already looked for a nats-server to dispose of, so one started after it runs on
 * (until the demo exits) and its JetStream store directory (<tmp>/gym-ckpt-nats-*) stays behind.
 */
const gate = vi.hoisted(() => {
  let release!: () => void;
  const opened = new Promise<void>((resolve) => (release = resolve));
  let entered!: (root: string) => void;
  const reached = new Promise<string>((resolve) => (entered = resolve));
  return { opened, release, reached, entered };
});
const natsStarts = vi.hoisted(() => ({ count: 0 }));

vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const real = await importOriginal<typeof import("node:fs/promises")>();
  return withOverrides(real, {
    // The run's first step, mkdir of <work>/checkpoints, is held until the test releases it.
    mkdir: async (...args: Parameters<typeof real.mkdir>) => {
      const made = await real.mkdir(...args);
      if (String(args[0]).endsWith("checkpoints")) {
        gate.entered(String(args[0]));
        await gate.opened;
      }
      return made;
    },
  });
});
vi.mock("../../../coordinator/local/nats-server-process.js", () => ({
  NatsServerProcess: {
    start: () => {
      natsStarts.count++;
      return Promise.reject(new Error("no nats-server in this test"));
    },
  },
}));

const { runDemo } = await import("../../../coordinator/local/demo.js");

afterEach(() => gate.release());

describe("runDemo aborted", () => {
  it("while its first step runs: rejects, removes its work directory, and starts no nats-server after the clean-up", async () => {
    const abort = new AbortController();
    const lines: string[] = [];
    const demo = runDemo({ rows: 4, concurrency: 1, checkpointEvery: 1, crashAfter: 0.5, tokenDelayMs: 0, keep: false, say: (line) => lines.push(line), signal: abort.signal });
    const root = await gate.reached;
    abort.abort();
    await expect(demo).rejects.toThrow("demo aborted");
    // The clean-up is over; the run still waits in its mkdir. Let it go on, and let every step it
    // takes without waiting on I/O run (setImmediate comes after the microtasks they queue).
    gate.release();
    for (let i = 0; i < 3; i++) await new Promise((resolve) => setImmediate(resolve));
    expect(natsStarts.count).toBe(0);
    expect(lines).toEqual([]);
    expect(existsSync(dirname(root))).toBe(false);
  });
});
