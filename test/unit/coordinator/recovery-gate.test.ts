import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { HttpControllerApi } from "../../../coordinator/api/http-api.js";
import { CheckpointError, HEADER_COORDINATOR_EPOCH, HEADER_COORDINATOR_ID, HEADER_COORDINATOR_SERVED } from "../../../protocol/index.js";
import { journalEmptied, journalEntry, makeEngine, writers } from "./fake-participants.js";
import { refusalOf } from "../../support/refusal.js";

let root: string;
let http: HttpControllerApi | undefined;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-gate-"));
});
afterEach(async () => {
  await http?.stop();
  http = undefined;
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

describe("controller ops wait for recovery (the daemon's engine)", () => {
  it("refuses every state-changing op with not_leader until recover() ran, and again after leadership is lost", async () => {
    const { engine, fake, journal } = makeEngine(root, { requireRecovery: true });
    expect(engine.recovered).toBe(false);
    expect((await refusalOf(engine.checkpoint({ checkpoint_id: "g1", episode_ids: null, stop: false, controller_state: null }))).code).toBe("not_leader");
    expect((await refusalOf(engine.prepare({ checkpoint_id: "g1" }))).code).toBe("not_leader");
    expect((await refusalOf(engine.restore({ episode_ids: [] }))).code).toBe("not_leader");
    expect((await refusalOf(engine.retire({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).code).toBe("not_leader");
    expect(fake.calls).toHaveLength(0);
    expect(journal.log).toHaveLength(0);
    expect((await engine.status()).participants).toHaveLength(5); // read-only, served anyway
    // Not ready until recovered: its `checkpoint: null` says nothing of a predecessor's left journaled.
    expect((await engine.status()).coordinator).toMatchObject({ leader: true, ready: false });
    await engine.recover();
    expect((await engine.status()).coordinator).toMatchObject({ leader: true, ready: true });
    expect(engine.recovered).toBe(true);
    await engine.prepare({ checkpoint_id: "g1" });
    engine.leadershipLost();
    expect((await refusalOf(engine.resume({ checkpoint_id: "g1" }))).code).toBe("not_leader");
    await engine.recover(); // the new term's recovery resumes g1 from its journal entry
    await journalEmptied(journal);
    await engine.prepare({ checkpoint_id: "g2" });
  });

  it("tells a follower's caller that it is not the leader, and a new leader's caller that it is recovering", async () => {
    const { engine, leadership } = makeEngine(root, { requireRecovery: true });
    const recovering = await refusalOf(engine.prepare({ checkpoint_id: "f1" }));
    expect(recovering.code).toBe("not_leader");
    expect(recovering.message).toMatch(/is the leader but has not finished recovering/);
    leadership.demote();
    const follower = await refusalOf(engine.prepare({ checkpoint_id: "f1" }));
    expect(follower.code).toBe("not_leader");
    expect(follower.message).toMatch(/is not the leader/);
    expect(follower.message).not.toMatch(/recovering/);
  });

  it("a recovery that cannot read the journal keeps the gate shut; the next one completes the predecessor's decided commit", async () => {
    const { engine, fake, journal } = makeEngine(root, { requireRecovery: true });
    // A predecessor decided d1 (every participant prepared, nothing committed yet) and died.
    await journal.record(journalEntry({ checkpoint_id: "d1", epoch: 6, state: "decided", participants: fake.members.map((m) => ({ kind: m.kind, instance: m.instance })), checkpoint_dir: join(root, "d1") }));
    fake.events.length = 0;
    const list = journal.list.bind(journal);
    journal.list = async () => {
      journal.list = list; // fails once, as a KV keys() timeout at failover would
      throw new Error("timeout listing the journal");
    };
    await expect(engine.recover()).rejects.toThrow("timeout listing the journal");
    expect(engine.recovered).toBe(false);
    expect((await refusalOf(engine.prepare({ checkpoint_id: "new1" }))).code).toBe("not_leader");
    expect(fake.calls).toHaveLength(0);
    expect([...journal.entries.keys()]).toEqual(["d1"]);
    expect(await engine.recover()).toEqual([{ checkpoint_id: "d1", action: expect.any(String) }]);
    expect(engine.recovered).toBe(true);
    expect(fake.ops("commit")).toHaveLength(5);
    await journalEmptied(journal);
    await engine.prepare({ checkpoint_id: "new1" });
  });

  it("a follower whose lease is held by a coordinator of another protocol version names it, over HTTP too", async () => {
    const { engine, leadership } = makeEngine(root, { requireRecovery: true });
    const other = "the leader lease is held by coordinator coord-v2, which speaks protocol version 2 (a newer gym-ckpt)";
    leadership.demote();
    leadership.leaderOfOtherVersion = () => other;
    const follower = await refusalOf(engine.prepare({ checkpoint_id: "f1" }));
    expect(follower).toMatchObject({ code: "not_leader", message: expect.stringContaining(other) });
    http = new HttpControllerApi({ engine, leadership, token: "t" });
    const base = await http.start();
    const ready = await fetch(`${base}/readyz`);
    expect(ready.status).toBe(503);
    expect(((await ready.json()) as { error: { code: string; detail: string } }).error).toMatchObject({ code: "not_leader", detail: expect.stringContaining(other) });
    // A follower holds no term: its refusal names it, without an epoch header.
    expect([ready.headers.get(HEADER_COORDINATOR_ID), ready.headers.get(HEADER_COORDINATOR_EPOCH)]).toEqual([leadership.state().id, null]);
  });

  // A leader whose term served, refusing /readyz (its renewal lapsed; or it stops, answering the ops
  // under way before it lets the lease go), names its term as one a client did not see take the op
  // otherwise: the client would take it for a successor not serving yet and end the op it answers.
  it("HTTP: a leader whose term served says so on its /readyz refusal (renewal lapsed)", async () => {
    const { engine, leadership } = makeEngine(root);
    const term = leadership.state();
    let lapsed = false;
    const lapsing = Object.assign(Object.create(leadership) as typeof leadership, { state: () => ({ ...term, ready: !lapsed, serving: true }) });
    http = new HttpControllerApi({ engine, leadership: lapsing, token: "t" });
    const base = await http.start();
    const answer = async () => {
      const response = await fetch(`${base}/readyz`);
      await response.body?.cancel();
      return [response.status, response.headers.get(HEADER_COORDINATOR_EPOCH), response.headers.get(HEADER_COORDINATOR_SERVED)];
    };
    expect(await answer()).toEqual([200, String(term.epoch), "1"]);
    lapsed = true;
    expect(await answer()).toEqual([503, String(term.epoch), "1"]);
  });

  // The daemon marks its lease serving only after the NATS API subscribed (markServing), a few ms
  // after the HTTP API serves ops (the engine recovered), and never if that subscribe fails or a stop
  // begins in between. A /readyz refusal of that term in the gap lacked Served: a client took the
  // term answering its op for one not serving yet, and ended the op (outcome_unknown).
  it("HTTP: a term whose HTTP API serves ops says it served, before the lease is marked serving", async () => {
    const { engine, leadership } = makeEngine(root, { requireRecovery: true });
    const term = leadership.state();
    let lapsed = false;
    const unmarked = Object.assign(Object.create(leadership) as typeof leadership, { state: () => ({ ...term, ready: !lapsed, serving: false }) });
    http = new HttpControllerApi({ engine, leadership: unmarked, token: "t" });
    const base = await http.start();
    const answer = async () => {
      const response = await fetch(`${base}/readyz`);
      await response.body?.cancel();
      return [response.status, response.headers.get(HEADER_COORDINATOR_EPOCH), response.headers.get(HEADER_COORDINATOR_SERVED)];
    };
    // Recovering: no op served in this term yet.
    expect(await answer()).toEqual([503, String(term.epoch), null]);
    await engine.recover();
    expect((await fetch(`${base}/v1/prepare`, { method: "POST", headers: { authorization: "Bearer t" }, body: JSON.stringify({ checkpoint_id: "s1" }) })).status).toBe(200);
    expect(await answer()).toEqual([200, String(term.epoch), "1"]);
    lapsed = true; // its renewal lapsed, the lease still not marked serving
    expect(await answer()).toEqual([503, String(term.epoch), "1"]);
    // The term ended: the next one (not recovered yet) served nothing.
    engine.leadershipLost();
    expect(await answer()).toEqual([503, String(term.epoch), null]);
  });

  // list and get read the catalog, which knows of an aborted checkpoint whose checkpoint.json could
  // not be taken back only at the leader that aborted it or recovered its entry. A leader whose
  // renewal lapsed (frozen, starved) may already have a successor that aborted one: it refuses them as
  // it refuses every op (Leadership.epoch) and as its /readyz and its silent NATS API say.
  it("list and get answer not_leader while the lease's renewal lapsed, over HTTP too, though the engine recovered", async () => {
    const { engine, leadership } = makeEngine(root, { requireRecovery: true });
    await engine.recover();
    expect((await engine.list()).checkpoints).toEqual([]);
    const term = leadership.state();
    const epoch = leadership.epoch.bind(leadership);
    let lapsed = false;
    leadership.state = () => ({ ...term, ready: !lapsed });
    leadership.epoch = () => {
      if (lapsed) throw new CheckpointError("not_leader", `coordinator ${term.id} has not renewed its lease for 5000 ms`);
      return epoch();
    };
    http = new HttpControllerApi({ engine, leadership, token: "t" });
    const base = await http.start();
    const read = async (path: string) => {
      const response = await fetch(`${base}${path}`, { headers: { authorization: "Bearer t" } });
      return [response.status, ((await response.json()) as { error?: { code: string } }).error?.code];
    };
    expect(await read("/v1/checkpoints")).toEqual([200, undefined]);
    expect(await read("/v1/checkpoints/g1")).toEqual([404, "not_found"]);
    lapsed = true;
    expect((await refusalOf(engine.list())).code).toBe("not_leader");
    expect((await refusalOf(engine.get({ checkpoint_id: "g1" }))).code).toBe("not_leader");
    expect(await read("/v1/checkpoints")).toEqual([503, "not_leader"]);
    expect(await read("/v1/checkpoints/g1")).toEqual([503, "not_leader"]);
    expect((await refusalOf(engine.prepare({ checkpoint_id: "g1" }))).code).toBe("not_leader");
    lapsed = false; // renewed again
    expect(await read("/v1/checkpoints")).toEqual([200, undefined]);
  });

  it("HTTP: /readyz and the ops answer not_leader while the lease is ready but recovery has not run", async () => {
    const { engine, leadership } = makeEngine(root, { requireRecovery: true });
    http = new HttpControllerApi({ engine, leadership, token: "t" });
    const base = await http.start();
    expect(leadership.state().ready).toBe(true);
    const ready = await fetch(`${base}/readyz`);
    expect(ready.status).toBe(503);
    // The bare catalog refusal (older clients read it strictly); headers name the coordinator that
    // refused and the term it holds (a client behind a balancer compares the id).
    expect(await ready.json()).toEqual({ error: { code: "not_leader", detail: expect.any(String) } });
    expect([ready.headers.get(HEADER_COORDINATOR_ID), ready.headers.get(HEADER_COORDINATOR_EPOCH)]).toEqual([leadership.state().id, String(leadership.state().epoch)]);
    // A term not serving yet: no word that it served (a client counts its refusals as a term not serving yet).
    expect(ready.headers.get(HEADER_COORDINATOR_SERVED)).toBeNull();
    const prepare = () => fetch(`${base}/v1/prepare`, { method: "POST", headers: { authorization: "Bearer t" }, body: JSON.stringify({ checkpoint_id: "h1" }) });
    expect((await prepare()).status).toBe(503);
    await engine.recover();
    expect((await fetch(`${base}/readyz`)).status).toBe(200);
    expect((await prepare()).status).toBe(200);
  });
});
