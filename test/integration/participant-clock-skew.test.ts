import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HEADER_SENT_AT } from "../../protocol/index.js";
import { systemClock, type Clock } from "../../participants/control-plane/clock.js";
import { startParticipant } from "../../participants/control-plane/start-participant.js";
import { startCoordinator } from "../../coordinator/daemon/coordinator-daemon.js";
import { controlRequest } from "../support/control-requests.js";
import { rawRequestWithHeaders } from "../support/raw-nats-request.js";
import { DEFAULT_MEMBERS, LoggedKind, NO_HTTP, PARTICIPANT_TOKEN, startWorld, type World } from "./coordinator-harness.js";

/**
 * docs/operations.md "Clocks": deadlines are absolute, so a participant whose clock runs ahead of
 * the coordinator's by more than an op's timeout refuses every op `deadline_exceeded`. Its refusal
 * says so, from the coordinator's send time (Gym-Sent-At), and the coordinator passes that detail
 * on to the controller; requests without the header (older coordinators) are served as before.
 */
const SKEW_MS = 120_000;
const skewed: Clock = { ...systemClock, now: () => Date.now() + SKEW_MS };

let world: World;
const logged: Record<string, unknown>[] = [];
const coordinatorLogged: Record<string, unknown>[] = [];

beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants(DEFAULT_MEMBERS.filter((m) => m.instance !== "env1"));
  const adapter = new LoggedKind("environment", "env1");
  const logger = pino({ level: "info" }, { write: (line: string) => void logged.push(JSON.parse(line)) });
  const handle = await startParticipant({ nc: world.pnc, deployment: world.deployment, instance: "env1", token: PARTICIPANT_TOKEN, adapter, clock: skewed, logger });
  world.participants.push({ kind: "environment", instance: "env1", adapter, handle });
  const coordinator = await startCoordinator({
    config: world.config(NO_HTTP),
    nc: await world.nats.connect(),
    logger: pino({ level: "info" }, { write: (line: string) => void coordinatorLogged.push(JSON.parse(line)) }),
  });
  world.coordinators.push(coordinator);
  await coordinator.whenReady();
});
afterAll(async () => {
  await world?.close();
});

describe("a participant whose clock runs 120 s ahead of the coordinator's", () => {
  it("refuses the coordinator's prepare deadline_exceeded naming the skew, and the controller sees that detail", async () => {
    const reply = await world.client.prepare({ checkpoint_id: "skew-1" });
    expect(reply.prepared).toBe(false);
    const env1 = reply.participants.find((p) => p.instance === "env1");
    expect(env1?.error?.code).toBe("deadline_exceeded");
    expect(env1?.error?.detail).toMatch(/the deadline has already passed: this participant's clock reads 1[12]\d\.\d s ahead of the coordinator's .*keep the hosts' clocks in sync \(NTP, chrony\)/);
    expect(reply.blockers).toContainEqual(expect.objectContaining({ instance: "env1", code: "deadline_exceeded" }));
    // The others were never asked (env1's stage failed) or were released: nothing stays paused.
    expect(world.participant("env1").handle.controlPlane.currentPhase).toBe("idle");

    // Warned once, at the leader's first request here (its recovery's status probe), not per op.
    const warnings = logged.filter((l) => l["msg"] === "clock_skew");
    expect(warnings).toHaveLength(1);
    const warning = warnings[0];
    expect(warning).toMatchObject({ level: 40, instance: "env1", kind: "environment" });
    expect(warning?.["offset_ms"]).toBeGreaterThan(SKEW_MS - 1000);
    expect(warning?.["offset_ms"]).toBeLessThan(SKEW_MS + 10_000);
    await world.client.resume({ checkpoint_id: "skew-1" });
  });

  it("fails the end-to-end checkpoint prepare_incomplete naming the skew, also in the coordinator's participant_refused log", async () => {
    const error = await world.client.checkpoint({ checkpoint_id: "skew-2" }).then(
      () => undefined,
      (e: unknown) => e,
    );
    // The refusal carries the participant's own detail beside its code: the code alone does not say what to fix.
    expect(error).toMatchObject({ code: "prepare_incomplete", message: expect.stringMatching(/environment\/env1: deadline_exceeded \(the deadline has already passed: this participant's clock reads 1[12]\d\.\d s ahead/) });
    const refused = coordinatorLogged.find((l) => l["msg"] === "participant_refused" && l["checkpoint_id"] === "skew-2");
    expect(refused).toMatchObject({ level: 40, kind: "environment", instance: "env1", op: "prepare", code: "deadline_exceeded", detail: expect.stringMatching(/clock reads 1[12]\d\.\d s ahead of the coordinator's/) });
  });

  it("serves a request without the header (an older coordinator), and one whose header it cannot read, as before", async () => {
    const target = { deployment: world.deployment, kind: "environment" as const, instance: "env1", token: PARTICIPANT_TOKEN };
    // A deadline in time by the participant's own clock: no refusal, the send time being unknown.
    const body = (id: string) => ({ checkpoint_id: id, deadline_ts: skewed.now() / 1000 + 30, epoch: 1 });
    expect(await controlRequest(world.nats.nc, target, "renew", body("old-1"))).toMatchObject({ error: { code: "invalid_phase" } });
    const status = await controlRequest(world.nats.nc, target, "status", {});
    expect(status).toMatchObject({ phase: "idle", instance: "env1" });

    const subject = `gym.ckpt.v1.${world.deployment}.p.environment.env1.resume`;
    for (const value of ["soon", "-1", "1e12", ""]) {
      const block = `NATS/1.0\r\nAuthorization: Bearer ${PARTICIPANT_TOKEN}\r\n${HEADER_SENT_AT}: ${value}\r\n\r\n`;
      expect(JSON.parse(await rawRequestWithHeaders(world.nats.server.url, subject, block, JSON.stringify(body("old-2")))), value).toEqual({ phase: "idle", idempotent: expect.any(Boolean) });
    }
  });
});
