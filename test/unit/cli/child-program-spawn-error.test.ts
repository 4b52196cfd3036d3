import { describe, expect, it } from "vitest";
import { startChildProgram } from "../../../coordinator/local/child-program.js";

/**
 * Runs `body` with node's binary gone (removed by an upgrade while this process runs): spawn then
 * emits 'error' (ENOENT), never 'exit', as it does for EAGAIN, EMFILE and ENFILE.
 */
async function withoutNode<T>(body: () => Promise<T>): Promise<T> {
  const execPath = process.execPath;
  process.execPath = "/nonexistent/gym-ckpt/node";
  try {
    return await body();
  } finally {
    process.execPath = execPath;
  }
}

describe("a child program that could not be started", () => {
  it("rejects its ready wait with spawn's error, and `exited` settles (no unhandled 'error')", { timeout: 10_000 }, async () => {
    const start = withoutNode(() => startChildProgram("never-run.mjs", [], { waitReady: true, readyTimeoutMs: 60_000 }));
    await expect(start).rejects.toThrow(/never-run\.mjs could not be started: .*ENOENT/);
  });

  it("without a ready wait, `exited` settles (code and signal null)", { timeout: 10_000 }, async () => {
    const program = await withoutNode(() => startChildProgram("never-run.mjs", []));
    expect(await program.exited).toEqual({ code: null, signal: null });
    await program.kill(); // nothing to kill: returns
  });
});
