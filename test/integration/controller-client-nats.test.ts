import { Kvm } from "@nats-io/kv";
import { connect, headers, type Msg } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { NatsControllerApi } from "../../coordinator/api/nats-api.js";
import { LEASE_READ_REUSE_MS, LeaderLeaseReader } from "../../coordinator/client/leader-watch.js";
import { NatsControllerClient } from "../../coordinator/client/nats-controller-client.js";
import type { CheckpointEngine } from "../../coordinator/engine/checkpoint-engine.js";
import { NatsParticipantTransport } from "../../coordinator/engine/nats-transport.js";
import { LEADER_KEY, LeaderLease } from "../../coordinator/ha/leader-lease.js";
import { CheckpointError, HEADER_AUTHORIZATION, MAX_CONTROL_MESSAGE_BYTES, PROTOCOL_VERSION, controllerSubject, encodeLeaseValue, leaderBucket } from "../../protocol/index.js";
import { rawRequestWithHeaders } from "../support/raw-nats-request.js";
import { NatsServerProcess, startNats, type NatsFixture } from "../support/nats.js";
import { startStallProxy } from "../support/stall-proxy.js";
import { waitUntil } from "../support/wait-until.js";
import { outcomeAcrossWallStepBack } from "../support/wall-clock-step.js";
import { CONTROLLER_TOKEN, startWorld } from "./coordinator-harness.js";

// The controller client's own failure mapping over a real nats-server, without a coordinator:
// nobody subscribed → not_leader once the leader wait runs out; a silent responder → outcome_unknown.
let nats: NatsFixture;
beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  await nats.close();
});

const client = (deployment: string, options: { leaderWaitMs?: number; timeoutMs?: number } = {}) =>
  new NatsControllerClient({ nc: nats.nc, deployment, token: "ctl-token", slackMs: 0, ...options });

describe("NATS controller client", () => {
  it("reports not_leader when no coordinator answers within the leader wait, after retrying", async () => {
    const started = Date.now();
    await expect(client("nobody", { leaderWaitMs: 300 }).call("status", {})).rejects.toMatchObject({ code: "not_leader" });
    // Retried while waiting for a leader (no-responders is immediate), not one timeout.
    expect(Date.now() - started).toBeGreaterThanOrEqual(300);
    expect(Date.now() - started).toBeLessThan(5_000);
  });

  it("names the leader's protocol version in not_leader when a coordinator of another version holds the lease", async () => {
    const deployment = "other-version";
    const kv = await new Kvm(nats.nc).create(leaderBucket(deployment), { history: 1, ttl: 60_000 });
    try {
      const v1Older = { id: "coord-old", term: "0123456789abcdef", serving: true, epoch: 1, at: Date.now() };
      await kv.put(LEADER_KEY, JSON.stringify({ ...v1Older, id: "coord-v2", protocol_version: PROTOCOL_VERSION + 1 }));
      await expect(client(deployment, { leaderWaitMs: 200 }).call("status", {})).rejects.toMatchObject({
        code: "not_leader",
        message: expect.stringContaining(`coordinator coord-v2, which speaks protocol version ${PROTOCOL_VERSION + 1}`),
      });
      // A v1 coordinator older than the field is read as this version's: no such hint.
      await kv.put(LEADER_KEY, JSON.stringify(v1Older));
      const refusal = await client(deployment, { leaderWaitMs: 200 }).call("status", {}).catch((error: unknown) => error);
      expect(refusal).toMatchObject({ code: "not_leader" });
      expect((refusal as Error).message).not.toContain("protocol version");
    } finally {
      await kv.destroy();
    }
  });

  it("a standby coordinator names a leader of another protocol version in its not_leader", async () => {
    const deployment = "other-version-standby";
    const kv = await new Kvm(nats.nc).create(leaderBucket(deployment), { history: 1, ttl: 60_000 });
    const standby = new LeaderLease({ nc: nats.nc, deployment, id: "coord-v1", leaseMs: 60_000 });
    try {
      await kv.put(LEADER_KEY, JSON.stringify({ id: "coord-v2", term: "0123456789abcdef", serving: true, epoch: 1, at: Date.now(), protocol_version: PROTOCOL_VERSION + 1 }));
      await standby.start(); // its first campaign finds the key held, then reads who holds it
      await waitUntil(() => standby.leaderOfOtherVersion() !== undefined, "the standby to read the holder", 5_000);
      expect(() => standby.epoch()).toThrow(expect.objectContaining({ code: "not_leader", message: expect.stringContaining(`coordinator coord-v2, which speaks protocol version ${PROTOCOL_VERSION + 1}`) }));
      expect(standby.leaderOfOtherVersion()).toContain("coord-v2");
    } finally {
      await standby.stop();
      await kv.destroy();
    }
  });

  // Before, the leader wait was a Date.now() instant: a wall clock stepped back kept the client
  // asking for the step's length (an hour) instead of leaderWaitMs.
  it("times the leader wait on the monotonic clock: a wall-clock step back does not stretch it", async () => {
    expect(await outcomeAcrossWallStepBack(() => client("nobody-stepped", { leaderWaitMs: 500 }).call("status", {}))).toBe("not_leader");
  });

  it("reports outcome_unknown when the coordinator received the request but never replied", async () => {
    const seen: (string | undefined)[] = [];
    const sub = nats.nc.subscribe(controllerSubject("silent", "status"), {
      callback: (_e, msg) => {
        seen.push(msg.headers?.get(HEADER_AUTHORIZATION));
      },
    });
    await nats.nc.flush();
    try {
      await expect(client("silent", { timeoutMs: 200 }).call("status", {})).rejects.toMatchObject({ code: "outcome_unknown" });
      expect(seen).toEqual(["Bearer ctl-token"]);
    } finally {
      sub.unsubscribe();
    }
  });

  it("decodes the coordinator's reply, and its refusal with the catalog code", async () => {
    const sub = nats.nc.subscribe(controllerSubject("echo", "status"), {
      callback: (_e, msg) => {
        msg.respond(JSON.stringify({ error: { code: "unauthorized", detail: "bad or missing bearer token" } }));
      },
    });
    await nats.nc.flush();
    try {
      await expect(client("echo").call("status", {})).rejects.toMatchObject({ code: "unauthorized" });
    } finally {
      sub.unsubscribe();
    }
  });

  it("a coordinator that is not answering (a frozen leader woken with its lease expired) stays silent, so the ready leader's reply is the one the controller gets", async () => {
    const deposed = { list: async () => Promise.reject(new CheckpointError("not_leader", "no longer the leader")) } as unknown as CheckpointEngine;
    const leader = { list: async () => new Promise((resolve) => setTimeout(() => resolve({ latest: "c1", checkpoints: [] }), 100)) } as unknown as CheckpointEngine;
    const woken = new NatsControllerApi({ nc: nats.nc, deployment: "pair", token: "ctl-token", engine: deposed, answering: () => false });
    const ready = new NatsControllerApi({ nc: nats.nc, deployment: "pair", token: "ctl-token", engine: leader, answering: () => true });
    await woken.start();
    await ready.start();
    try {
      // the deposed one would refuse first; its not_leader would send the controller to retry
      expect(await client("pair", { leaderWaitMs: 500 }).call("list", {})).toMatchObject({ latest: "c1" });
    } finally {
      await woken.stop();
      await ready.stop();
    }
  });

  it("the typed client names an id-less checkpoint itself, so a retry repeats the same op", async () => {
    const bodies: Record<string, unknown>[] = [];
    const sub = nats.nc.subscribe(controllerSubject("ids", "checkpoint"), {
      callback: (_e, msg) => {
        bodies.push(msg.json());
        // the first try is refused as if by a deposed leader; the client retries
        if (bodies.length === 1) msg.respond(JSON.stringify({ error: { code: "not_leader", detail: "deposed" } }));
      },
    });
    await nats.nc.flush();
    try {
      await expect(client("ids", { leaderWaitMs: 400, timeoutMs: 200 }).checkpoint({})).rejects.toMatchObject({ code: "outcome_unknown" });
      expect(bodies.length).toBe(2);
      expect(bodies[0]!.checkpoint_id).toMatch(/^ckpt-/);
      expect(bodies[1]!.checkpoint_id).toBe(bodies[0]!.checkpoint_id);
    } finally {
      sub.unsubscribe();
    }
  });

  it("the coordinator's NATS API answers a header block nats.js cannot decode (a key with a space) unauthorized, not internal_error, and keeps serving", async () => {
    const engine = { list: async () => ({ latest: null, checkpoints: [] }) } as unknown as CheckpointEngine;
    const api = new NatsControllerApi({ nc: nats.nc, deployment: "badhdr", token: "ctl-token", engine });
    await api.start();
    await nats.nc.flush();
    try {
      const reply = await rawRequestWithHeaders(nats.server.url, controllerSubject("badhdr", "list"), "NATS/1.0\r\nBad Key: x\r\n\r\n", "{}");
      expect(JSON.parse(reply).error.code).toBe("unauthorized");
      expect(await client("badhdr").call("list", {})).toMatchObject({ latest: null });
    } finally {
      await api.stop();
    }
  });

  it("the coordinator's NATS API reads the Authorization header in any case, as the HTTP API does", async () => {
    const engine = { list: async () => ({ latest: null, checkpoints: [] }) } as unknown as CheckpointEngine;
    const api = new NatsControllerApi({ nc: nats.nc, deployment: "anycase", token: "ctl-token", engine });
    await api.start();
    await nats.nc.flush();
    try {
      const ask = async (name: string, value: string) => {
        const h = headers();
        h.set(name, value);
        return (await nats.nc.request(controllerSubject("anycase", "list"), "", { headers: h, timeout: 5_000 })).json<Record<string, unknown>>();
      };
      for (const name of ["Authorization", "authorization", "AUTHORIZATION"]) expect([name, await ask(name, "Bearer ctl-token")]).toEqual([name, { latest: null, checkpoints: [] }]);
      expect(await ask("authorization", "Bearer wrong")).toMatchObject({ error: { code: "unauthorized" } });
    } finally {
      await api.stop();
    }
  });

  it("refuses a request over the control-message limit with payload_too_large before sending it, as the HTTP client's 413", async () => {
    let received = 0;
    const sub = nats.nc.subscribe(controllerSubject("big", "restore"), {
      callback: (_e, msg) => {
        received++;
        msg.respond(JSON.stringify({ error: { code: "internal_error", detail: "should not have arrived" } }));
      },
    });
    await nats.nc.flush();
    try {
      // 30,000 episodes: within the schema's 100,000, about 1.4 MB of JSON.
      const scope = Array.from({ length: 30_000 }, (_, i) => ({ rollout_id: `rollout-${String(i).padStart(6, "0")}`, attempt: 0 }));
      const thrown = await client("big", { leaderWaitMs: 0 }).restore({ episode_ids: scope }).catch((error: unknown) => error);
      expect(thrown).toBeInstanceOf(CheckpointError);
      expect(thrown).toMatchObject({ code: "payload_too_large" });
      // A body just under the limit that its headers push over the server's max_payload: nats.js'
      // own refusal, mapped the same way.
      const padding = MAX_CONTROL_MESSAGE_BYTES - 20 - JSON.stringify({ episode_ids: [{ rollout_id: "", attempt: 0 }] }).length;
      const nearly = { episode_ids: [{ rollout_id: "r".repeat(padding), attempt: 0 }] };
      expect(Buffer.byteLength(JSON.stringify(nearly))).toBe(MAX_CONTROL_MESSAGE_BYTES - 20);
      await expect(client("big", { leaderWaitMs: 0 }).restore(nearly)).rejects.toMatchObject({ code: "payload_too_large" });
      await nats.nc.flush();
      expect(received).toBe(0);
    } finally {
      sub.unsubscribe();
    }
  });

  it("an op that takes a deadline, sent without one, waits past 90 s (the coordinator runs it until its default_timeout_ms, up to 7 days) and gets the coordinator's answer", async () => {
    const held: Msg[] = [];
    const subs = ["prepare", "list"].map((op) => nats.nc.subscribe(controllerSubject("slow", op), { callback: (_e, msg) => void held.push(msg) }));
    await nats.nc.flush();
    const received = async (n: number) => {
      const until = performance.now() + 10_000;
      while (held.length < n && performance.now() < until) await new Promise((resolve) => setImmediate(resolve));
      expect(held.length).toBe(n);
    };
    const slow = new NatsControllerClient({ nc: nats.nc, deployment: "slow", token: "ctl-token" });
    // Only the client's reply timer is faked: 100 s pass at once (a coordinator with default_timeout_ms 100 s).
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
    try {
      const prepared = slow.prepare({ checkpoint_id: "slow-1" }).catch((error: unknown) => error);
      await received(1);
      vi.advanceTimersByTime(100_000);
      held[0]!.respond(JSON.stringify({ error: { code: "prepare_incomplete", detail: "environment/env1: 1 blocker" } }));
      expect(await prepared).toMatchObject({ code: "prepare_incomplete" });
      // An op that takes no deadline (status, list, get, publish) keeps the 90 s wait.
      const listed = slow.list().catch((error: unknown) => error);
      await received(2);
      vi.advanceTimersByTime(90_000);
      expect(await listed).toMatchObject({ code: "outcome_unknown" });
    } finally {
      vi.useRealTimers();
      for (const sub of subs) sub.unsubscribe();
    }
  });

  // publish takes no deadline: only waits past 90 s were watched, and a publish whose coordinator
  // was killed with it in hand waited its full 90 s. A commit with a deadline (collect's own ops)
  // waited out its deadline plus the slack, the Gym paused, though a successor could answer sooner.
  it.each([
    ["checkpoint (takes a deadline; up to 7 days without one)", "checkpoint"],
    ["publish (takes none; 90 s)", "publish"],
    ["commit sent with a deadline 60 s ahead", "commit"],
  ] as const)("%s stops waiting (outcome_unknown) once the coordinator that took it no longer holds the leader lease", async (_what, op) => {
    // The lease as a coordinator writes it; the coordinator itself is a silent responder (killed mid-op).
    const deployment = `lost-${op}`;
    const kv = await new Kvm(nats.nc).create(leaderBucket(deployment), { history: 1, ttl: 60_000 });
    await kv.create(LEADER_KEY, JSON.stringify({ id: "coord-a", at: Date.now() }));
    const held: Msg[] = [];
    const sub = nats.nc.subscribe(controllerSubject(deployment, op), { callback: (_e, msg) => void held.push(msg) });
    await nats.nc.flush();
    try {
      const watched = new NatsControllerClient({ nc: nats.nc, deployment, token: "ctl-token", leaderCheckMs: 20 });
      const sent =
        op === "checkpoint"
          ? watched.checkpoint({ checkpoint_id: "lost-1", episode_ids: [] })
          : op === "publish"
            ? watched.publish({ checkpoint_id: "lost-1" })
            : watched.commit({ checkpoint_id: "lost-1", episode_ids: [], deadline_ts: Date.now() / 1000 + 60 });
      const outcome = sent.catch((error: unknown) => error);
      await waitUntil(() => held.length === 1, "the request to reach the coordinator");
      // Still leading (renewed): the client keeps waiting. A short window for a non-event: a client
      // that gave up on the renewal would do so as soon as the watch delivered it.
      await kv.put(LEADER_KEY, JSON.stringify({ id: "coord-a", at: Date.now() }));
      const early = await Promise.race([outcome, new Promise((resolve) => setTimeout(() => resolve("waiting"), 200))]);
      expect(early).toBe("waiting");
      // Its lease expired (deleted here) with no reply sent.
      await kv.delete(LEADER_KEY);
      const lost = await Promise.race([outcome, new Promise((resolve) => setTimeout(() => resolve("still waiting"), 10_000))]);
      expect(lost).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("coord-a stopped leading") });
    } finally {
      sub.unsubscribe();
      await kv.destroy();
    }
  });
});

describe("NATS controller client: how often a waiting op re-reads the lease", () => {
  it("every lease period (the leader bucket's max_age) when that is shorter than 5 s: a lapsed lease is noticed within about one", async () => {
    const deployment = "short-lease";
    const kv = await new Kvm(nats.nc).create(leaderBucket(deployment), { history: 1, ttl: 300 });
    await kv.create(LEADER_KEY, JSON.stringify({ id: "coord-a", at: Date.now() }));
    const held: Msg[] = [];
    const sub = nats.nc.subscribe(controllerSubject(deployment, "publish"), { callback: (_e, msg) => void held.push(msg) });
    await nats.nc.flush();
    try {
      // No leaderCheckMs: the default. The coordinator took the op and died: its key is not renewed and lapses.
      const client = new NatsControllerClient({ nc: nats.nc, deployment, token: "ctl-token" });
      const outcome = client.publish({ checkpoint_id: "short-1" }).catch((error: unknown) => error);
      await waitUntil(() => held.length === 1, "the request to reach the coordinator");
      const lost = await Promise.race([outcome, new Promise((resolve) => setTimeout(() => resolve("still waiting"), 3_000))]);
      expect(lost).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("coord-a stopped leading") });
    } finally {
      sub.unsubscribe();
      await kv.destroy();
    }
  });
});

describe("NATS controller client: the leader lease after a frozen or restarted coordinator", () => {
  /** A coordinator's lease as the daemon holds it; `stop()` without release is a crash (its key stays until it expires). */
  const leading = async (deployment: string, id: string) => {
    const lease = new LeaderLease({ nc: nats.nc, deployment, id, leaseMs: 60_000 });
    await lease.start();
    expect(lease.state().leader).toBe(true);
    return lease;
  };
  /** A silent responder: the coordinator that took the request never answers it (frozen, then woken with its lease expired). */
  const silent = async (deployment: string) => {
    const held: Msg[] = [];
    const sub = nats.nc.subscribe(controllerSubject(deployment, "checkpoint"), { callback: (_e, msg) => void held.push(msg) });
    await nats.nc.flush();
    return { held, sub };
  };
  const settledWithin = (outcome: Promise<unknown>, ms: number) => Promise.race([outcome, new Promise((resolve) => setTimeout(() => resolve("still waiting"), ms))]);

  it("ends outcome_unknown when the coordinator that led leads again in a new term (lost its lease and won it back, or restarted under the same coordinator_id)", async () => {
    const first = await leading("again", "coord-a");
    const { held, sub } = await silent("again");
    try {
      const client = new NatsControllerClient({ nc: nats.nc, deployment: "again", token: "ctl-token", leaderCheckMs: 1_000 });
      const outcome = client.checkpoint({ checkpoint_id: "again-1", episode_ids: [] }).catch((error: unknown) => error);
      await waitUntil(() => held.length === 1, "the request to reach the coordinator");
      // The term that took the request ends (its key is gone); the same coordinator id wins the next one.
      await first.stop();
      const second = await leading("again", "coord-a");
      try {
        expect(await settledWithin(outcome, 10_000)).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("coord-a") });
      } finally {
        await second.stop();
      }
    } finally {
      sub.unsubscribe();
      await (await new Kvm(nats.nc).open(leaderBucket("again"))).destroy();
    }
  });

  it("ends outcome_unknown when nobody led as the op was sent (the frozen coordinator that took it stays silent)", async () => {
    const gone = await leading("nobody-led", "coord-a");
    await gone.stop(); // nobody leads now; a frozen coordinator is still subscribed
    const { held, sub } = await silent("nobody-led");
    try {
      const client = new NatsControllerClient({ nc: nats.nc, deployment: "nobody-led", token: "ctl-token", leaderCheckMs: 50 });
      const outcome = client.checkpoint({ checkpoint_id: "nobody-1", episode_ids: [] }).catch((error: unknown) => error);
      await waitUntil(() => held.length === 1, "the request to reach the coordinator");
      expect(await settledWithin(outcome, 10_000)).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("no coordinator led") });
    } finally {
      sub.unsubscribe();
      await (await new Kvm(nats.nc).open(leaderBucket("nobody-led"))).destroy();
    }
  });
});

describe("NATS controller client: an op sent while the lease cannot be read", () => {
  it("ends outcome_unknown once the lease reads again naming another term than the last seen serving (a NATS restart that moved the lease), not when its wait runs out", async () => {
    const deployment = "unread-lease";
    const lease = (id: string, term: string) => encodeLeaseValue({ id, term, serving: true, epoch: 1, at: Date.now() });
    const kvm = new Kvm(nats.nc);
    let kv = await kvm.create(leaderBucket(deployment), { history: 1, ttl: 60_000 });
    await kv.put(LEADER_KEY, lease("coord-a", "t1"));
    // An earlier op, answered after its lease read: the client saw coord-a serve.
    const status = nats.nc.subscribe(controllerSubject(deployment, "status"), {
      callback: (_e, msg) => void setTimeout(() => msg.respond(JSON.stringify({ error: { code: "unauthorized", detail: "refused" } })), 300),
    });
    const held: Msg[] = [];
    const silent = nats.nc.subscribe(controllerSubject(deployment, "checkpoint"), { callback: (_e, msg) => void held.push(msg) });
    await nats.nc.flush();
    try {
      const client = new NatsControllerClient({ nc: nats.nc, deployment, token: "ctl-token", leaderCheckMs: 200 });
      await expect(client.call("status", {})).rejects.toMatchObject({ code: "unauthorized" });
      // The lease unreadable as the op is sent, then back naming another coordinator.
      await kv.destroy();
      const outcome = client.checkpoint({ checkpoint_id: "unread-1", episode_ids: [] }).catch((error: unknown) => error);
      await waitUntil(() => held.length === 1, "the request to reach the coordinator");
      kv = await kvm.create(leaderBucket(deployment), { history: 1, ttl: 60_000 });
      await kv.put(LEADER_KEY, lease("coord-b", "t2"));
      const settled = await Promise.race([outcome, new Promise((resolve) => setTimeout(() => resolve("still waiting"), 10_000))]);
      expect(settled).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("coord-b leads now") });
    } finally {
      status.unsubscribe();
      silent.unsubscribe();
      await kv.destroy().catch(() => undefined);
    }
  });
});

describe("NATS controller client: an op sent while its NATS server restarts", () => {
  it("ends outcome_unknown about a second after the server is back with the lease moved, not after the lease read's 5 s JetStream timeout and a period", async () => {
    // A lease read sent while the connection is down is not answered after the reconnect: it waits
    // out JetStream's 5 s timeout, though a fresh read answers at once. Then the old client read
    // again a period later and checked a period after that (chaos seed 46: a collector's checkpoint
    // sent into a NATS restart ended 7 s later at a 1 s lease, every row paused; 15 s at 5 s).
    const server = await NatsServerProcess.start({});
    const nc = await connect({ servers: server.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    const deployment = "restarting";
    const lease = (id: string, term: string) => encodeLeaseValue({ id, term, serving: true, epoch: 1, at: Date.now() });
    try {
      const kv = await new Kvm(nc).create(leaderBucket(deployment), { history: 1, ttl: 60_000 });
      await kv.put(LEADER_KEY, lease("coord-a", "t1"));
      // An earlier op, answered after its lease read: the client saw coord-a serve.
      nc.subscribe(controllerSubject(deployment, "status"), {
        callback: (_e, msg) => void setTimeout(() => msg.respond(JSON.stringify({ error: { code: "unauthorized", detail: "refused" } })), 300),
      });
      nc.subscribe(controllerSubject(deployment, "checkpoint"), { callback: () => undefined });
      // The default check period here is 5 s (the bucket's max_age is longer).
      const client = new NatsControllerClient({ nc, deployment, token: "ctl-token" });
      await expect(client.call("status", {})).rejects.toMatchObject({ code: "unauthorized" });
      const disconnected = (async () => {
        for await (const status of nc.status()) if (status.type === "disconnect") return;
      })();
      await server.kill();
      // Sent once the client knows it is disconnected: held until it reconnects, then delivered (a
      // request sent before would end outcome_unknown at the disconnect, its reply possibly lost).
      await disconnected;
      const outcome = client.checkpoint({ checkpoint_id: "restart-1", episode_ids: [] }).catch((error: unknown) => error);
      await server.restart();
      // Another process moves the lease (the client's own connection may not have reconnected yet).
      const writer = await connect({ servers: server.url });
      await (await new Kvm(writer).open(leaderBucket(deployment))).put(LEADER_KEY, lease("coord-b", "t2"));
      await writer.close();
      const backAt = Date.now();
      const settled = await Promise.race([outcome, new Promise((resolve) => setTimeout(() => resolve("still waiting"), 4_000))]);
      expect(settled).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("coord-b leads now") });
      expect(Date.now() - backAt).toBeLessThan(4_000);
    } finally {
      await nc.close();
      await server.dispose();
    }
  });
});

describe("NATS controller client: a successor that does not serve yet", () => {
  it("ends outcome_unknown when the lease named a coordinator not serving yet (a frozen predecessor took the op), also while it does not serve", async () => {
    // The successor won the lease and waits out its first lease period (or its recovery keeps
    // failing); the predecessor, frozen, is still subscribed and takes the request (it stays
    // silent when it wakes).
    const held: Msg[] = [];
    const sub = nats.nc.subscribe(controllerSubject("successor", "checkpoint"), { callback: (_e, msg) => void held.push(msg) });
    await nats.nc.flush();
    const successor = new LeaderLease({ nc: nats.nc, deployment: "successor", id: "coord-b", leaseMs: 60_000 });
    await successor.start();
    try {
      const client = new NatsControllerClient({ nc: nats.nc, deployment: "successor", token: "ctl-token", leaderCheckMs: 50 });
      const outcome = client.checkpoint({ checkpoint_id: "successor-1", episode_ids: [] }).catch((error: unknown) => error);
      await waitUntil(() => held.length === 1, "the request to reach the frozen predecessor");
      const settled = await Promise.race([outcome, new Promise((resolve) => setTimeout(() => resolve("still waiting"), 10_000))]);
      expect(settled).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("coord-b did not serve") });
    } finally {
      sub.unsubscribe();
      await successor.stop();
      await (await new Kvm(nats.nc).open(leaderBucket("successor"))).destroy();
    }
  });

  it("a coordinator's lease says it serves once its controller API is subscribed", async () => {
    const world = await startWorld({ nats });
    try {
      const coordinator = await world.startCoordinator({ coordinator_id: "serving-1", http: { enabled: false, host: "127.0.0.1", port: 0 } });
      await coordinator.whenReady();
      const entry = await (await new Kvm(nats.nc).open(leaderBucket(world.deployment))).get(LEADER_KEY);
      expect(JSON.parse(entry!.string())).toMatchObject({ id: "serving-1", serving: true });
    } finally {
      await world.close();
    }
  });
});

describe("the leader-lease read beside an op sent without a deadline", () => {
  /** Counts the reads of `deployment`'s leader key at the stream's leader, as the server sees them. */
  const countLeaseReads = async (deployment: string, subjects = `$JS.API.STREAM.MSG.GET.KV_${leaderBucket(deployment)}`) => {
    const reads = { count: 0 };
    const sub = nats.nc.subscribe(subjects, { callback: (_e, msg) => void (reads.count += msg.subject.endsWith(`.KV_${leaderBucket(deployment)}`) ? 1 : 0) });
    await nats.nc.flush();
    return { reads, stop: () => sub.unsubscribe() };
  };
  const leaseHeld = async (deployment: string, serving: boolean) => {
    const kv = await new Kvm(nats.nc).create(leaderBucket(deployment), { history: 1, ttl: 60_000 });
    await kv.put(LEADER_KEY, encodeLeaseValue({ id: "coord-a", term: "t1", serving, epoch: 1, at: Date.now() }));
    return kv;
  };

  it("a read naming a serving leader stands for the ops sent within LEASE_READ_REUSE_MS of it, and only those", async () => {
    const kv = await leaseHeld("reuse-serving", true);
    const { reads, stop } = await countLeaseReads("reuse-serving");
    let now = 1_000;
    const reader = new LeaderLeaseReader(nats.nc, "reuse-serving", () => now);
    try {
      expect(await reader.leaderAsSent()).toMatchObject({ id: "coord-a", serving: true });
      // Another holder now: within the window the op still goes by the read (no term created after
      // it can serve before a whole lease period, at least 200 ms, has passed).
      await kv.put(LEADER_KEY, encodeLeaseValue({ id: "coord-b", term: "t2", serving: true, epoch: 5, at: Date.now() }));
      now += LEASE_READ_REUSE_MS - 1;
      expect(await reader.leaderAsSent()).toMatchObject({ id: "coord-a" });
      await nats.nc.flush();
      expect(reads.count).toBe(1);
      now += 1;
      expect(await reader.leaderAsSent()).toMatchObject({ id: "coord-b", term: "t2" });
      await nats.nc.flush();
      expect(reads.count).toBe(2);
    } finally {
      stop();
      await kv.destroy();
    }
  });

  it("a disconnect of the client's connection ends the window: ops queued while it reconnects may reach the server late", async () => {
    const kv = await leaseHeld("reuse-reconnect", true);
    const { reads, stop } = await countLeaseReads("reuse-reconnect");
    // Not the fixture's connect: it reports a connection dropping while its server runs.
    const nc = await connect({ servers: nats.server.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    const now = 1_000; // the clock stands still: only the reconnect ends the window
    const reader = new LeaderLeaseReader(nc, "reuse-reconnect", () => now);
    try {
      expect(await reader.leaderAsSent()).toMatchObject({ id: "coord-a", serving: true });
      expect(await reader.leaderAsSent()).toMatchObject({ id: "coord-a" });
      await nats.nc.flush();
      expect(reads.count).toBe(1);
      let reconnected = false;
      void (async () => {
        for await (const status of nc.status()) if (status.type === "reconnect") reconnected = true;
      })();
      await nc.reconnect();
      await waitUntil(() => reconnected, "the client's connection to reconnect");
      // The disconnect before it ended the window: this op's read is fresh.
      expect(await reader.leaderAsSent()).toMatchObject({ id: "coord-a", serving: true });
      await nats.nc.flush();
      expect(reads.count).toBe(2);
    } finally {
      stop();
      await nc.close();
      await kv.destroy();
    }
  });

  it("a leader not serving yet, nobody leading, or a lease that cannot be read is read again for the next op", async () => {
    const kv = await leaseHeld("reuse-not-serving", false);
    const { reads, stop } = await countLeaseReads("reuse-not-serving");
    const now = 1_000; // the clock stands still: only what the read said decides
    const reader = new LeaderLeaseReader(nats.nc, "reuse-not-serving", () => now);
    try {
      expect(await reader.leaderAsSent()).toMatchObject({ id: "coord-a", serving: false });
      expect(await reader.leaderAsSent()).toMatchObject({ id: "coord-a", serving: false });
      await kv.delete(LEADER_KEY);
      expect(await reader.leaderAsSent()).toBeNull();
      expect(await reader.leaderAsSent()).toBeNull();
      await nats.nc.flush();
      expect(reads.count).toBe(4);
    } finally {
      stop();
      await kv.destroy();
    }
    // No bucket at all (no coordinator started yet): unreadable each time.
    expect(await new LeaderLeaseReader(nats.nc, "reuse-no-bucket", () => now).leaderAsSent()).toBeUndefined();
  });

  it("the client's ops in quick succession share a read, the first op's own", async () => {
    const world = await startWorld({ nats });
    try {
      const coordinator = await world.startCoordinator({ coordinator_id: "reuse-1", http: { enabled: false, host: "127.0.0.1", port: 0 } });
      await coordinator.whenReady();
      // Every request of the read: the store's proof (STREAM.INFO, DIRECT.GET) and the read itself.
      const { reads, stop } = await countLeaseReads(world.deployment, "$JS.API.>");
      try {
        const controller = new NatsControllerClient({ nc: nats.nc, deployment: world.deployment, token: CONTROLLER_TOKEN });
        const ops = 20;
        for (let i = 0; i < ops; i++) expect((await controller.status()).coordinator).toMatchObject({ id: "reuse-1", leader: true });
        await nats.nc.flush();
        // At least one request per op before (25 for these 20); now the store's proof and one read
        // per LEASE_READ_REUSE_MS window (5 here, a few more on a slow machine).
        expect(reads.count).toBeGreaterThanOrEqual(1);
        expect(reads.count).toBeLessThan(ops);
      } finally {
        stop();
      }
    } finally {
      await world.close();
    }
  });
});

describe("the shared reply subscription of NATS requests", () => {
  it("takes its reply subjects under the connection's inboxPrefix, which a role's NATS permissions allow it alone", async () => {
    const prefix = "_INBOX_test_role";
    const nc = await connect({ servers: nats.server.url, inboxPrefix: prefix });
    let reply: string | undefined;
    const responder = nats.nc.subscribe("inbox.test.echo", {
      callback: (_e, msg) => {
        reply = msg.reply;
        msg.respond("{}");
      },
    });
    try {
      await nats.nc.flush();
      expect(await new NatsParticipantTransport(nc).request("inbox.test.echo", "{}", { timeoutMs: 5_000, token: "t" })).toBe("{}");
      expect(reply).toMatch(new RegExp(`^${prefix}\\.`));
    } finally {
      responder.unsubscribe();
      await nc.close();
    }
  });
});

describe("NATS controller client across a disconnect of its own", () => {
  it("an op whose reply may have been lost while the client reconnected ends outcome_unknown at once, not when its (days-long) wait runs out", async () => {
    const proxy = await startStallProxy(nats.server.port);
    const clientNc = await connect({ servers: proxy.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    const held: Msg[] = [];
    const sub = nats.nc.subscribe(controllerSubject("blip", "checkpoint"), { callback: (_e, msg) => void held.push(msg) });
    await nats.nc.flush();
    try {
      const client = new NatsControllerClient({ nc: clientNc, deployment: "blip", token: "ctl-token" });
      let settled: unknown = "pending";
      void client.checkpoint({ checkpoint_id: "blip-1", episode_ids: [] }).then(
        (reply) => (settled = reply),
        (error: unknown) => (settled = error),
      );
      await waitUntil(() => held.length === 1, "the request to reach the coordinator");
      // The client's connection drops; the coordinator answers meanwhile: that reply is lost.
      proxy.cut();
      held[0]!.respond(JSON.stringify({ error: { code: "prepare_incomplete", detail: "answered while the client was away" } }));
      await waitUntil(() => settled !== "pending", "the op to end once its connection dropped", 10_000);
      expect(settled).toMatchObject({ code: "outcome_unknown" });
    } finally {
      sub.unsubscribe();
      proxy.heal();
      await clientNc.close().catch(() => undefined);
      await proxy.close();
    }
  });
});

describe("NATS controller client whose NATS goes away for good", () => {
  it.each([
    { how: "nats-server stops", lost: /lost its NATS connection/ },
    { how: "the client's connection is closed", lost: /NATS connection closed/ },
  ])("an op waiting for its reply when $how ends outcome_unknown at once, naming the connection, not a reply timeout", async ({ how, lost }) => {
    const own = await startNats();
    const clientNc = await connect({ servers: own.server.url, maxReconnectAttempts: 0 });
    const held: Msg[] = [];
    const sub = own.nc.subscribe(controllerSubject("gone", "checkpoint"), { callback: (_e, msg) => void held.push(msg) });
    await own.nc.flush();
    try {
      const client = new NatsControllerClient({ nc: clientNc, deployment: "gone", token: "ctl-token", timeoutMs: 600_000 });
      let settled: unknown = "pending";
      void client.checkpoint({ checkpoint_id: "gone-1", episode_ids: [] }).then(
        (reply) => (settled = reply),
        (error: unknown) => (settled = error),
      );
      await waitUntil(() => held.length === 1, "the request to reach the coordinator");
      if (how === "nats-server stops") await own.server.stop();
      else await clientNc.close();
      await waitUntil(() => settled !== "pending", "the op to end once its connection went away", 10_000);
      expect(settled).toBeInstanceOf(CheckpointError);
      expect(settled).toMatchObject({ code: "outcome_unknown", message: expect.stringMatching(lost) });
      expect((settled as Error).message).not.toMatch(/within/);
    } finally {
      sub.unsubscribe();
      await clientNc.close().catch(() => undefined);
      await own.close();
    }
  });
});

describe("NATS controller client on a connection already closed", () => {
  // nats.js throws its own ClosedConnectionError (or DrainingConnectionError) before anything is
  // sent: it reached the caller as is, no CheckpointError and no catalog code (internal_error for
  // the CLI's and collector's error mapping, "report a bug").
  it.each(["closed", "draining"])("an op sent on a %s connection is not_leader at once (nothing was sent), not a raw nats.js error, and not retried for the leader wait", async (how) => {
    const clientNc = await nats.connect();
    const received: Msg[] = [];
    const sub = nats.nc.subscribe(controllerSubject("closed-conn", "status"), { callback: (_e, msg) => void received.push(msg) });
    await nats.nc.flush();
    try {
      if (how === "closed") await clientNc.close();
      else void clientNc.drain();
      const started = performance.now();
      const settled = await new NatsControllerClient({ nc: clientNc, deployment: "closed-conn", token: "ctl-token", leaderWaitMs: 5_000 }).status().then(
        () => "answered",
        (error: unknown) => error,
      );
      expect(settled).toBeInstanceOf(CheckpointError);
      expect(settled).toMatchObject({ code: "not_leader", message: expect.stringMatching(/NATS connection is (closed|draining).*nothing was sent/) });
      expect(performance.now() - started).toBeLessThan(2_000);
      expect(received).toEqual([]);
    } finally {
      sub.unsubscribe();
      await clientNc.close().catch(() => undefined);
    }
  });
});

describe("coordinator NATS API: a message without a reply subject", () => {
  // docs/api.md: a request whose reply subject is not a controller's inbox is neither run nor
  // answered. One with no reply subject at all (a `nats pub`) was run: a prepare parked every
  // participant for a caller that could learn nothing of it, not even that the token was right.
  it("is neither run nor answered (logged controller_request_refused), like one whose reply subject is no inbox", async () => {
    const ran: string[] = [];
    const engine = {
      prepare: async (request: { checkpoint_id: string }) => {
        ran.push(request.checkpoint_id);
        return { checkpoint_id: request.checkpoint_id, epoch: 1, prepared: true, stopped_at: null, participants: [], blockers: [], restarts: [] };
      },
    } as unknown as CheckpointEngine;
    const warned: unknown[] = [];
    const logger = { warn: (fields: unknown, event: string) => warned.push({ fields, event }), error: () => undefined, info: () => undefined, debug: () => undefined } as unknown as NonNullable<ConstructorParameters<typeof NatsControllerApi>[0]["logger"]>;
    const api = new NatsControllerApi({ nc: nats.nc, deployment: "no-reply", token: "ctl-token", engine, logger });
    await api.start();
    const sender = await nats.connect();
    try {
      const h = headers();
      h.set(HEADER_AUTHORIZATION, "Bearer ctl-token");
      sender.publish(controllerSubject("no-reply", "prepare"), JSON.stringify({ checkpoint_id: "fire-and-forget" }), { headers: h });
      await sender.flush();
      // A request with a reply subject, sent after it on the same connection, is served: the
      // message without one was delivered (and refused) before it.
      await expect(client("no-reply").call("prepare", { checkpoint_id: "asked" })).resolves.toMatchObject({ checkpoint_id: "asked" });
      expect(ran).toEqual(["asked"]);
      expect(warned).toEqual([expect.objectContaining({ event: "controller_request_refused" })]);
    } finally {
      await sender.close();
      await api.stop();
    }
  });
});
