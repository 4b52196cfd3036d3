import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NatsControllerApi } from "../../coordinator/api/nats-api.js";
import { NatsControllerClient } from "../../coordinator/client/nats-controller-client.js";
import type { CheckpointEngine } from "../../coordinator/engine/checkpoint-engine.js";
import { controllerSubject } from "../../protocol/index.js";
import { NatsServerProcess } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";

// A NATS account that may not subscribe one controller subject (a permission list missing it):
// the server refuses that subscription after the SUB was sent, and nats.js ends its iterator with
// the permission error. That must be a logged failure of that op's subject, not an unhandled
// rejection that ends the coordinator process.
const DEPLOYMENT = "denied";
const TOKEN = "ctl-token";
let dir: string;
let server: NatsServerProcess;
let nc: NatsConnection;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-ctl-denied-"));
  const config = join(dir, "nats.conf");
  await writeFile(
    config,
    `authorization { users = [ { user: coord, password: pw, permissions: { subscribe: { allow: [">"], deny: ["${controllerSubject(DEPLOYMENT, "status")}"] } } } ] }\n`,
  );
  server = await NatsServerProcess.start({ args: ["-c", config] });
  nc = await connect({ servers: server.url, user: "coord", pass: "pw" });
});

afterAll(async () => {
  await nc?.close();
  await server?.dispose();
  await rm(dir, { recursive: true, force: true });
});

describe("the NATS controller API when the server refuses one of its subscriptions", () => {
  it("logs it and keeps serving the other ops, without an unhandled rejection", async () => {
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => void unhandled.push(reason);
    process.on("unhandledRejection", onUnhandled);
    const logged: { msg: string; op?: string }[] = [];
    const logger = pino({ level: "error" }, { write: (line: string) => void logged.push(JSON.parse(line) as { msg: string; op?: string }) });
    const engine = { list: async () => ({ latest: null, checkpoints: [] }) } as unknown as CheckpointEngine;
    const api = new NatsControllerApi({ nc, deployment: DEPLOYMENT, token: TOKEN, engine, logger });
    try {
      await api.start();
      await waitUntil(() => unhandled.length > 0 || logged.some((l) => l.msg === "controller_api_subscription_failed"), "the refused subscription to be logged", 10_000);
      expect(unhandled).toEqual([]);
      expect(logged.find((l) => l.msg === "controller_api_subscription_failed")).toMatchObject({ op: "status" });
      const client = new NatsControllerClient({ nc, deployment: DEPLOYMENT, token: TOKEN, timeoutMs: 5_000, leaderWaitMs: 0 });
      expect(await client.list()).toEqual({ latest: null, checkpoints: [] });
      expect(unhandled).toEqual([]);
    } finally {
      process.off("unhandledRejection", onUnhandled);
      await api.stop();
    }
  });
});
