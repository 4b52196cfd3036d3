import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ControlEndpoint } from "../../participants/control-plane/nats-endpoint.js";
import { ManualClock } from "../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../participants/testing/scriptable-kind.js";
import { participantSubject } from "../../protocol/index.js";
import { controlRequest } from "../support/control-requests.js";
import { NatsServerProcess } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";

// A NATS account that may not subscribe one of a participant's control subjects (a permission list
// missing it): the server refuses that subscription after the SUB was sent, and nats.js ends its
// iterator with the permission error. That must be a logged failure of that op's subject (the
// coordinator sees the op unreachable), not an unhandled rejection that ends the Gym server.
const DEPLOYMENT = "denied";
const TOKEN = "participant-token";
let dir: string;
let server: NatsServerProcess;
let nc: NatsConnection;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-participant-denied-"));
  const config = join(dir, "nats.conf");
  const denied = participantSubject(DEPLOYMENT, "environment", "env0", "renew");
  await writeFile(config, `authorization { users = [ { user: env, password: pw, permissions: { subscribe: { allow: [">"], deny: ["${denied}"] } } } ] }\n`);
  server = await NatsServerProcess.start({ args: ["-c", config] });
  nc = await connect({ servers: server.url, user: "env", pass: "pw" });
});

afterAll(async () => {
  await nc?.close();
  await server?.dispose();
  await rm(dir, { recursive: true, force: true });
});

describe("a participant's control endpoint when the server refuses one of its subscriptions", () => {
  it("logs it and keeps answering the other ops, without an unhandled rejection", async () => {
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => void unhandled.push(reason);
    process.on("unhandledRejection", onUnhandled);
    const logged: { msg: string; op?: string }[] = [];
    const logger = pino({ level: "error" }, { write: (line: string) => void logged.push(JSON.parse(line) as { msg: string; op?: string }) });
    const plane = new ParticipantControlPlane({ adapter: new ScriptableKind("environment"), instance: "env0", clock: new ManualClock(1_700_000_000_000) });
    const endpoint = new ControlEndpoint(plane, { nc, deployment: DEPLOYMENT, token: TOKEN, logger });
    try {
      endpoint.start();
      await waitUntil(() => unhandled.length > 0 || logged.some((l) => l.msg === "control_subscription_failed"), "the refused subscription to be logged", 10_000);
      expect(unhandled).toEqual([]);
      expect(logged.find((l) => l.msg === "control_subscription_failed")).toMatchObject({ op: "renew" });
      const status = await controlRequest(nc, { deployment: DEPLOYMENT, kind: "environment", instance: "env0", token: TOKEN }, "status", {}, 5000);
      expect(status).toMatchObject({ phase: "idle" });
      expect(unhandled).toEqual([]);
    } finally {
      process.off("unhandledRejection", onUnhandled);
      await endpoint.stop();
      plane.dispose();
    }
  });
});
