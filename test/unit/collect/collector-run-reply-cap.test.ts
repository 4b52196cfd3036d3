import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { createServer, type Server } from "node:http";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { readResultsForAppend } from "../../../coordinator/collect/results-file.js";
import { MAX_RUN_REPLY_BYTES } from "../../../coordinator/collect/run-reply.js";
import { collectorIn, idleController } from "../../support/collector-fixture.js";
import { startOversizedBody, type OversizedBodyServer } from "../../support/oversized-body.js";

let dir: string;
let server: OversizedBodyServer | undefined;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-run-reply-cap-"));
});
afterEach(async () => {
  await server?.close();
  server = undefined;
  await rm(dir, { recursive: true, force: true });
});

/** A `/run` on 127.0.0.1 answering every request with `reply`; closed at teardown. */
let run: Server | undefined;
async function replyingRun(reply: string): Promise<string> {
  run = createServer((req, res) => {
    req.resume();
    req.on("end", () => res.end(reply));
  });
  await new Promise<void>((resolve) => run!.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(run.address() as { port: number }).port}/run`;
}
afterEach(async () => {
  run?.closeAllConnections();
  if (run) await new Promise((resolve) => run!.close(resolve));
  run = undefined;
});

/** The warnings a collector logs, parsed, and the logger writing them. */
function warnings() {
  const lines: { err?: { code?: string; message?: string } }[] = [];
  const logger = pino({ level: "warn" }, { write: (line: string) => void lines.push(JSON.parse(line) as (typeof lines)[number]) });
  return { lines, logger };
}

describe("collector /run reply size", () => {
  it("a /run reply past MAX_RUN_REPLY_BYTES fails its attempt payload_too_large, its stream cancelled", async () => {
    server = await startOversizedBody(2 * MAX_RUN_REPLY_BYTES);
    const { lines: failures, logger } = warnings();
    const collector = collectorIn(dir, `${server.url}/run`, idleController(), { logger, maxAttempts: 1 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 0, failed: 1 });
    expect(failures.find((f) => f.err)?.err).toMatchObject({ code: "payload_too_large", message: expect.stringContaining(`${MAX_RUN_REPLY_BYTES} bytes`) });
    await server.cancelled;
  });

  it("the cap is the collector's maxRunReplyBytes (--max-run-reply-mib): a trajectory longer than the default can be collected, and a smaller cap is kept", async () => {
    // A whole reply of 4 KiB (a long trajectory, scaled down): refused under a 1 KiB cap, kept under an 8 KiB one.
    const url = await replyingRun(JSON.stringify({ reward: 1, trajectory: { pad: "x".repeat(4096) } }));
    const { lines: failures, logger } = warnings();
    const small = collectorIn(dir, url, idleController(), { logger, maxAttempts: 1, maxRunReplyBytes: 1024 });
    await small.start();
    expect(await small.run()).toMatchObject({ finished: 0, failed: 1 });
    expect(failures.find((f) => f.err)?.err).toMatchObject({ code: "payload_too_large", message: expect.stringContaining("1024 bytes") });
    const other = await mkdtemp(join(tmpdir(), "gym-ckpt-run-reply-cap-"));
    try {
      const large = collectorIn(other, url, idleController(), { maxAttempts: 1, maxRunReplyBytes: 8192 });
      await large.start();
      expect(await large.run()).toMatchObject({ finished: 1, failed: 0 });
    } finally {
      await rm(other, { recursive: true, force: true });
    }
  });

  it("a reply whose results.jsonl line would be longer than a start reads fails its attempt payload_too_large; the file stays readable", async () => {
    const url = await replyingRun(JSON.stringify({ reward: 1, answer: "x".repeat(4096) }));
    const { lines: failures, logger } = warnings();
    const collector = collectorIn(dir, url, idleController(), { logger, maxAttempts: 1, maxResultLineBytes: 1024 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 0, failed: 1 });
    expect(failures.find((f) => f.err)?.err).toMatchObject({ code: "payload_too_large", message: expect.stringContaining("1024-byte limit") });
    expect(await readResultsForAppend(join(dir, "results.jsonl"), 1024)).toEqual(new Map());
  });
});
