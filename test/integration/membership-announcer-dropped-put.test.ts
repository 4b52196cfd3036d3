import { Kvm, type KvEntry } from "@nats-io/kv";
import { connect, type MsgHdrs, type NatsConnection, type RequestOptions } from "@nats-io/transport-node";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { MembershipAnnouncer, STOP_DELETE_WAIT_MS } from "../../participants/control-plane/membership-announcer.js";
import { memberKey, membersBucket } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { startStallProxy, type StallProxy } from "../support/stall-proxy.js";
import { waitUntil } from "../support/wait-until.js";

// A heartbeat put lost on its way to nats-server goes unanswered: nats.js gives up on it only after
// its request timeout. Before, the beat waited for that (5 s) and skipped every tick meanwhile, so
// one lost put left the entry unrefreshed for 5 s and more (with the default 5 s period, the whole
// 15 s TTL: the coordinator dropped a live participant). Now it costs that one beat.
let nats: NatsFixture;
let proxy: StallProxy;
beforeAll(async () => {
  nats = await startNats();
  proxy = await startStallProxy(Number(new URL(nats.server.url).port));
});
afterAll(async () => {
  await proxy?.close();
  await nats?.close();
});

const PERIOD_MS = 500;

describe("a participant whose heartbeat put is lost on the way to NATS", () => {
  it("keeps its registry entry: the next beat lands a period later, not after nats.js' timeout", { timeout: 30_000 }, async () => {
    const deployment = "anndrop";
    const key = memberKey("environment", "env0");
    const nc: NatsConnection = await connect({ servers: proxy.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    const announcer = new MembershipAnnouncer(nc, deployment, "environment", "env0", "inc-drop", undefined, PERIOD_MS);
    await announcer.claim();
    await announcer.start();
    // Every write that lands, as nats-server stamps it, seen by a watcher on a connection of its own.
    const landed: KvEntry[] = [];
    const watch = await (await new Kvm(nats.nc).open(membersBucket(deployment))).watch({ key });
    void (async () => {
      for await (const entry of watch) landed.push(entry);
    })();
    try {
      await waitUntil(() => landed.length >= 3, "the heartbeat's cadence");
      await proxy.dropNextPublish(`$KV.${membersBucket(deployment)}.${key}`);
      const droppedAt = landed.length;
      await waitUntil(() => landed.length >= droppedAt + 4, "beats after the lost put");
      expect(landed.map((entry) => entry.operation)).not.toContain("DEL");
      expect(landed.every((entry) => entry.operation === "PUT" && entry.json<{ incarnation: string }>().incarnation === "inc-drop")).toBe(true);
      const times = landed.map((entry) => entry.created.getTime());
      const gaps = times.slice(1).map((at, i) => at - times[i]!);
      // One beat lost, its successor on the next tick: two periods, plus scheduling slack (before: over 5 s).
      expect(Math.max(...gaps)).toBeLessThanOrEqual(2.5 * PERIOD_MS);
    } finally {
      watch.stop();
      await announcer.stop();
      await nc.close();
    }
  });
});

/** The announcer's connection, recording each request it sends (subject, KV operation) and whether it is still waiting. */
function recordingRequests(nc: NatsConnection): { nc: NatsConnection; requests: { subject: string; op: string | undefined; pending: boolean }[] } {
  const requests: { subject: string; op: string | undefined; pending: boolean }[] = [];
  const request = (subject: string, payload?: Uint8Array, opts?: RequestOptions) => {
    const sent = { subject, op: (opts?.headers as MsgHdrs | undefined)?.get("KV-Operation") || undefined, pending: true };
    requests.push(sent);
    return nc.request(subject, payload, opts).finally(() => (sent.pending = false));
  };
  const recording = new Proxy(nc, {
    get: (target, name) => {
      if (name === "request") return request;
      const value: unknown = Reflect.get(target, name, target);
      return typeof value === "function" ? (value as (...args: unknown[]) => unknown).bind(target) : value;
    },
  });
  return { nc: recording, requests };
}

// stop()'s delete of the entry is a compare-and-set on the revision last written. A beat in flight
// when stop() came lands first: the delete is refused, the entry read again and the delete sent
// again. Each request waited up to STOP_DELETE_WAIT_MS, but the retries as a whole were not capped:
// on a slow NATS the re-read still waited when stop() returned at 1 s, so a request of the stop
// outlived it (docs/protocol.md: none does), and its delete could land seconds after stop returned.
describe("stop() whose delete a beat overtook, on a slow NATS", () => {
  it("sends and settles all of its delete within STOP_DELETE_WAIT_MS: nothing of it outlives stop()", { timeout: 30_000 }, async () => {
    const deployment = "annstop";
    const key = memberKey("environment", "env0");
    const keySubject = `$KV.${membersBucket(deployment)}.${key}`;
    const raw: NatsConnection = await connect({ servers: proxy.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    const { nc, requests } = recordingRequests(raw);
    const announcer = new MembershipAnnouncer(nc, deployment, "environment", "env0", "inc-stop", undefined, PERIOD_MS);
    await announcer.claim();
    await announcer.start();
    try {
      // The network holds what the process sends: the next beat's put waits in the proxy.
      proxy.stall();
      const before = requests.length;
      await waitUntil(() => requests.slice(before).some((r) => r.subject === keySubject && r.op === undefined), "a beat's put, held");
      const startedAt = Date.now();
      const stopping = announcer.stop();
      await waitUntil(() => requests.some((r) => r.subject === keySubject && r.op === "DEL"), "stop()'s delete, held behind the beat");
      // The held bytes arrive: the beat lands first and the delete is refused; what the process
      // sends next (the entry read again) is held once more. That read is sent after stop() began:
      // given a whole STOP_DELETE_WAIT_MS of its own, it would still wait when stop() returned.
      proxy.heal();
      proxy.stall();
      await stopping;
      const tookMs = Date.now() - startedAt;
      const deletes = requests.filter((r) => r.subject === keySubject && r.op === "DEL");
      expect(deletes.length).toBeGreaterThanOrEqual(1);
      // The delete was refused and the entry read again (its read, not the delete, was held next).
      expect(requests.some((r) => r.subject.includes(".STREAM.MSG.GET.")), "the entry read again after the refused delete").toBe(true);
      expect(requests.filter((r) => r.pending).map((r) => r.subject), "requests of the stop still waiting when it returned").toEqual([]);
      expect(tookMs).toBeLessThan(STOP_DELETE_WAIT_MS + 500);
    } finally {
      proxy.heal();
      await raw.close();
    }
  });
});

// stop()'s bound was a Date.now() deadline: each request's timeout is what is left of it. The wall
// clock steps (NTP, a VM resumed): stepped back while the delete waited, the re-read after a refused
// delete waited what was left of an hour (stop() hung on a slow NATS, past the launcher's grace);
// stepped ahead, nothing was left and the entry was never deleted, though NATS answered.
describe("stop() under a wall-clock step", () => {
  let offset = 0;
  afterEach(() => {
    vi.restoreAllMocks();
    offset = 0;
  });

  /** An announcer whose beat's put the proxy holds, stop() called and its delete held behind it; the wall clock then moved by `step`. */
  async function stopWithDeleteHeld(deployment: string, step: number) {
    const wall = Date.now.bind(Date);
    vi.spyOn(Date, "now").mockImplementation(() => wall() + offset);
    const key = memberKey("environment", "env0");
    const keySubject = `$KV.${membersBucket(deployment)}.${key}`;
    const raw: NatsConnection = await connect({ servers: proxy.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    const { nc, requests } = recordingRequests(raw);
    const announcer = new MembershipAnnouncer(nc, deployment, "environment", "env0", "inc-step", undefined, PERIOD_MS);
    await announcer.claim();
    await announcer.start();
    proxy.stall();
    const before = requests.length;
    await waitUntil(() => requests.slice(before).some((r) => r.subject === keySubject && r.op === undefined), "a beat's put, held");
    let returned = false;
    const stopping = announcer.stop().then(() => (returned = true));
    await waitUntil(() => requests.some((r) => r.subject === keySubject && r.op === "DEL"), "stop()'s delete, held behind the beat");
    offset = step;
    return { raw, requests, stopping, returned: () => returned, key };
  }

  it("stepped back an hour while its delete waits: stop() still returns within STOP_DELETE_WAIT_MS", { timeout: 30_000 }, async () => {
    const { raw, requests, returned } = await stopWithDeleteHeld("annstepb", -3_600_000);
    try {
      // The beat lands first, the delete is refused; the entry's re-read is held.
      proxy.heal();
      proxy.stall();
      await waitUntil(returned, "stop() returned", STOP_DELETE_WAIT_MS + 1_500);
      expect(requests.filter((r) => r.pending).map((r) => r.subject), "requests of the stop still waiting when it returned").toEqual([]);
    } finally {
      proxy.heal();
      await raw.close();
    }
  });

  it("stepped ahead an hour while its delete waits: the delete is still resent and lands", { timeout: 30_000 }, async () => {
    const { raw, stopping, key } = await stopWithDeleteHeld("annstepa", 3_600_000);
    try {
      proxy.heal(); // the beat lands first, the delete is refused; NATS answers from now on
      await stopping;
      const entry = await (await new Kvm(nats.nc).open(membersBucket("annstepa"))).get(key);
      expect(entry?.operation ?? "gone").not.toBe("PUT");
    } finally {
      proxy.heal();
      await raw.close();
    }
  });
});
