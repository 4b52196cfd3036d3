import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MembershipAnnouncer } from "../../participants/control-plane/membership-announcer.js";
import { NATS_INBOX_PREFIXES, participantSubject } from "../../protocol/index.js";
import { NatsServerProcess } from "../support/nats.js";

/**
 * deploy/nats/nats-server.production.conf lets the gym user publish a participant's status subject
 * (the probe a participant sends on its own subject at start, to find a live twin). Instance names
 * may hold dots (protocol/ids.ts), each one more subject token, and the template allowed only
 * `p.*.*.status`: a participant named `env.1` had its probe refused (Permissions Violation) and its
 * start failed. The template now lists the status subjects of names of 1 to 8 tokens.
 */
const CONF = fileURLToPath(new URL("../../deploy/nats/nats-server.production.conf", import.meta.url));
const GYM_PASSWORD = "gym-pw";

let dir: string;
let server: NatsServerProcess;
const connections: NatsConnection[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-dotted-"));
  const config = join(dir, "nats.conf");
  // Single node, as nats-production-permissions.test.ts runs it: ports and store the fixture's.
  const production = await readFile(CONF, "utf8");
  await writeFile(
    config,
    production
      .replace(/^cluster \{[\s\S]*?^\}\n/m, "")
      .replace(/^\s*sync_interval:.*\n/m, "")
      .replace(/^(port|http_port):.*\n/gm, "")
      .replace(/^\s*store_dir:.*\n/m, ""),
  );
  Object.assign(process.env, { SERVER_NAME: "dotted-test", COORDINATOR_PASSWORD: "coord-pw", GYM_PASSWORD, CONTROLLER_PASSWORD: "ctl-pw" });
  server = await NatsServerProcess.start({ args: ["-c", config] });
}, 30_000);

afterAll(async () => {
  await Promise.allSettled(connections.map((nc) => nc.close()));
  await server?.dispose();
  if (dir) await rm(dir, { recursive: true, force: true });
});

async function gym(): Promise<NatsConnection> {
  const nc = await connect({ servers: server.url, user: "gym", pass: GYM_PASSWORD, inboxPrefix: NATS_INBOX_PREFIXES.gym });
  connections.push(nc);
  return nc;
}

describe("the production NATS permissions, for instance names with dots", () => {
  for (const instance of ["env1", "env.1", "pool.a.1", "a.b.c.d.e.f.g.h"]) {
    it(`let a participant named ${instance} claim its name, and find a live twin`, async () => {
      const nc = await gym();
      // Nobody serves the name: the claim finds no responders and takes it.
      const announcer = new MembershipAnnouncer(nc, "default", "environment", instance, "inc-1", undefined, 100);
      await announcer.claim();
      // A live process answers on the name's status subject (a refusal, as a participant answers a
      // probe without a token): the claim refuses to start a second one.
      const twin = await gym();
      const sub = twin.subscribe(participantSubject("default", "environment", instance, "status"), {
        callback: (_error, msg) => void msg.respond(JSON.stringify({ error: { code: "unauthorized", detail: "missing or wrong bearer token" } })),
      });
      await twin.flush();
      const second = new MembershipAnnouncer(nc, "default", "environment", instance, "inc-2", undefined, 100);
      await expect(second.claim()).rejects.toMatchObject({ code: "instance_conflict" });
      sub.unsubscribe();
    }, 20_000);
  }
});
