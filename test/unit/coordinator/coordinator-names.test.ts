import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection } from "@nats-io/transport-node";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { NatsControllerApi } from "../../../coordinator/api/nats-api.js";
import { CoordinatorConfigSchema } from "../../../coordinator/config/coordinator-config.js";
import { startCoordinator } from "../../../coordinator/daemon/coordinator-daemon.js";
import type { CheckpointEngine } from "../../../coordinator/engine/checkpoint-engine.js";
import { controllerSubject, journalBucket, leaderBucket, membersBucket, participantSubject } from "../../../protocol/index.js";
import { fakeSubscriptions } from "../../support/fake-subscriptions.js";

/**
 * A deployment becomes one NATS subject token and part of the KV bucket names. The coordinator's
 * config and every CLI refuse a name that is not one, but the library builds subjects from whatever
 * name it is given: a NatsControllerApi given `*` subscribed `gym.ckpt.v1.*.ctl.<op>` and answered
 * (and ran) every other deployment's controller requests with its own engine, and `a.p.environment`
 * made its controller subjects deployment `a`'s participant subjects (instance `ctl`). The subject
 * and bucket builders refuse such a name (invalid_request), as the participants' pieces do.
 */
const refusal = { name: "CheckpointError", code: "invalid_request" };
const NOT_ONE_TOKEN = ["*", ">", "prod.*", "a.b", "a.p.environment", "a b", ""];

describe("coordinator deployment names", () => {
  it("every subject and bucket built from a deployment refuses one that is no single subject token", () => {
    for (const deployment of NOT_ONE_TOKEN) {
      expect(() => controllerSubject(deployment, "status"), deployment).toThrow(expect.objectContaining(refusal));
      expect(() => participantSubject(deployment, "environment", "env0", "prepare"), deployment).toThrow(expect.objectContaining(refusal));
      for (const bucket of [membersBucket, leaderBucket, journalBucket]) expect(() => bucket(deployment), deployment).toThrow(expect.objectContaining(refusal));
    }
    expect(controllerSubject("job-1", "status")).toBe("gym.ckpt.v1.job-1.ctl.status");
    expect(leaderBucket("Job_1")).toBe("gym_ckpt_Job_1_leader");
  });

  it("the NATS controller API refuses such a deployment before subscribing anything", async () => {
    for (const deployment of NOT_ONE_TOKEN) {
      const subscribed: string[] = [];
      const inbox = fakeSubscriptions();
      const nc = { flush: async () => {}, subscribe: (subject: string) => (subscribed.push(subject), inbox.nc.subscribe(subject)) } as unknown as NatsConnection;
      const api = new NatsControllerApi({ nc, deployment, token: "tok", engine: {} as CheckpointEngine });
      await expect(api.start(), deployment).rejects.toMatchObject(refusal);
      expect(subscribed, deployment).toEqual([]);
    }
  });

  it("startCoordinator given an unchecked config with such a deployment refuses it before it touches the root", async () => {
    const root = await mkdtemp(join(tmpdir(), "gym-ckpt-names-"));
    try {
      const config = { ...CoordinatorConfigSchema.parse({ token: "t", checkpoint_root: root, http: { enabled: false } }), deployment: "*" };
      await expect(startCoordinator({ config, nc: {} as NatsConnection, logger: pino({ level: "silent" }) })).rejects.toMatchObject(refusal);
      expect(await readdir(root)).toEqual([]);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });
});
