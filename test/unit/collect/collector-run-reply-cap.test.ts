import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
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

describe("collector /run reply size", () => {
  it("a /run reply past MAX_RUN_REPLY_BYTES fails its attempt payload_too_large, its stream cancelled", async () => {
    server = await startOversizedBody(2 * MAX_RUN_REPLY_BYTES);
    const failures: { err?: { code?: string; message?: string } }[] = [];
    const logger = pino({ level: "warn" }, { write: (line: string) => void failures.push(JSON.parse(line) as (typeof failures)[number]) });
    const collector = collectorIn(dir, `${server.url}/run`, idleController(), { logger, maxAttempts: 1 });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 0, failed: 1 });
    expect(failures.find((f) => f.err)?.err).toMatchObject({ code: "payload_too_large", message: expect.stringContaining(`${MAX_RUN_REPLY_BYTES} bytes`) });
    await server.cancelled;
  });
});
