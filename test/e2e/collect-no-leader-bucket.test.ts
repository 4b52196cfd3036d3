import { jetstreamManager } from "@nats-io/jetstream";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LeaderLeaseReader } from "../../coordinator/client/leader-watch.js";
import { NatsServerProcess } from "../../coordinator/local/nats-server-process.js";
import { collectArgs } from "../support/collect-args.js";
import { cli, ensureBuilt } from "./coordinator-process.js";

/**
 * A collector whose deployment's leader bucket it cannot read: none exists (no coordinator ever
 * ran under that name, or a mistyped --deployment), or its NATS account has no JetStream. The
 * collector does not read the bucket to find a leader: it sends its ops and retries "no
 * responders" for --leader-wait-ms, then fails `not_leader`; the op timeouts (90 s for `status`)
 * never come into it. A missing bucket is not failed faster than that on purpose: a coordinator
 * starting beside the collector creates it within that wait.
 */
const APP = { GYM_CKPT_NATS_USER: "app", GYM_CKPT_NATS_PASS: "app-pass" };
let dir: string;
let server: NatsServerProcess;

beforeAll(async () => {
  ensureBuilt();
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-no-bucket-"));
  // JetStream is on for the server (NatsServerProcess passes -js); the APP account, not enabled for it, has none.
  const conf = join(dir, "nats.conf");
  await writeFile(conf, `accounts { APP: { users: [ { user: "${APP.GYM_CKPT_NATS_USER}", password: "${APP.GYM_CKPT_NATS_PASS}" } ] } }\n`);
  server = await NatsServerProcess.start({ args: ["-c", conf] });
  await writeFile(join(dir, "tasks.jsonl"), `${JSON.stringify({ id: "r0", task: { expression: "1 + 1" } })}\n`);
});
afterAll(async () => {
  await server?.dispose();
  await rm(dir, { recursive: true, force: true });
});

describe("collect with an unreadable leader bucket", () => {
  it("no JetStream on the collector's account: the lease cannot be read, and collect fails not_leader after --leader-wait-ms", { timeout: 30_000 }, async () => {
    const nc: NatsConnection = await connect({ servers: server.url, user: APP.GYM_CKPT_NATS_USER, pass: APP.GYM_CKPT_NATS_PASS });
    try {
      await expect(jetstreamManager(nc)).rejects.toThrow(); // the account really has no JetStream
      expect(await new LeaderLeaseReader(nc, "nojs").leader()).toBeUndefined(); // unreadable, not "nobody leads"
    } finally {
      await nc.close();
    }
    const began = Date.now();
    const run = await cli(collectArgs({ natsUrl: server.url, deployment: "nojs", token: "controller-token", root: dir, runUrl: "http://127.0.0.1:2/run" }, ["--leader-wait-ms", "1000"]), APP);
    expect({ code: run.code, error: run.stderr.trim().split("\n").at(-1) }).toEqual({ code: 1, error: "error not_leader: no coordinator serves gym.ckpt.v1.nojs.ctl.status" });
    expect(Date.now() - began).toBeLessThan(10_000);
  });

  it("no bucket for the deployment (JetStream on, no coordinator ever ran under the name): the same", { timeout: 30_000 }, async () => {
    const noAuthServer = await NatsServerProcess.start();
    try {
      const nc = await connect({ servers: noAuthServer.url });
      try {
        await jetstreamManager(nc); // JetStream answers: only the bucket is missing
        expect(await new LeaderLeaseReader(nc, "nobucket").leader()).toBeUndefined();
      } finally {
        await nc.close();
      }
      const began = Date.now();
      const run = await cli(collectArgs({ natsUrl: noAuthServer.url, deployment: "nobucket", token: "controller-token", root: dir, runUrl: "http://127.0.0.1:2/run" }, ["--leader-wait-ms", "1000"]));
      expect({ code: run.code, error: run.stderr.trim().split("\n").at(-1) }).toEqual({ code: 1, error: "error not_leader: no coordinator serves gym.ckpt.v1.nobucket.ctl.status" });
      expect(Date.now() - began).toBeLessThan(10_000);
    } finally {
      await noAuthServer.dispose();
    }
  });
});
