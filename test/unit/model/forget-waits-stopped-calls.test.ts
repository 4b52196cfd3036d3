import { mkdtemp, rm } from "node:fs/promises";
import { writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, expect, it } from "vitest";
import type { PhaseOp, RequestInputOf } from "../../../protocol/index.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ModelKind, type AdmissionTicket } from "../../../participants/kinds/model/index.js";
import { deferred } from "../../support/deferred.js";
import { refusalCode } from "../../support/refusal.js";
import { waitUntil } from "../../support/wait-until.js";
import { CHAT, chat, settle } from "./model-fixtures.js";

/**
 * A retire cut short by its deadline while a stopped call of the retired attempt still runs (its
 * row being written, so its ticket closes only once that write settles) answers deadline_exceeded.
 * A forget of the rollout must not lift the fence while that call, or a call of the fenced attempt
 * still being admitted (its first check passed before the retire's mark), can still run: it waits
 * for them as retire does, bounded by its own deadline (past it, deadline_exceeded, no fence lifted).
 */

const T0 = 1_700_000_000;
const teardown: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const step of teardown.splice(0).reverse()) await step();
});

async function world() {
  const clock = new ManualClock(T0 * 1000);
  const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-model-forget-"));
  teardown.push(() => rm(dir, { recursive: true, force: true }));
  // The ledger's fdatasync (a row's, or the outage probe's), held until `holdSyncs`' release.
  const held: (() => void)[] = [];
  const io = {
    syncGate: undefined as Promise<void> | undefined,
    failNextWrite: false,
    holdSyncs(): () => void {
      const gate = deferred();
      io.syncGate = gate.promise;
      held.push(gate.resolve);
      return gate.resolve;
    },
  };
  const kind = new ModelKind({
    ledgerDir: join(dir, "ledger"),
    cutBackend: null,
    ledgerProbeIntervalMs: 0,
    ledgerWrite: (fd, buffer, offset) => {
      if (io.failNextWrite) {
        io.failNextWrite = false;
        throw Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC", errno: -28, syscall: "write" });
      }
      return writeSync(fd, buffer, offset);
    },
    ledgerSync: async () => {
      await io.syncGate;
    },
  });
  const plane = new ParticipantControlPlane({ adapter: kind, instance: "model0", clock });
  teardown.push(async () => {
    for (const release of held) release(); // a failed test's held write must not hold close()
    plane.dispose();
    await kind.close();
  });
  const call = <O extends PhaseOp>(op: O, body: Partial<RequestInputOf<O>> & { checkpoint_id: string }) =>
    plane.handle(op, { deadline_ts: T0 + 10, epoch: 1, ...body } as never);
  return { clock, io, kind, plane, call };
}

/** What the attach proxy does once a call's row is written: a retired call's response does not leave (taken back), else it is delivered. */
const afterRecord = (kind: ModelKind, ticket: AdmissionTicket) => () => (ticket.abort.signal.aborted ? kind.undelivered(ticket) : kind.delivered(ticket));

const r1 = { rollout_id: "r1", attempt: 0 };

/** A call of r1 whose row is written and whose fdatasync is held: its ticket stays open. Retired, cut short. */
async function retireCutShortWhileRowSyncs(w: Awaited<ReturnType<typeof world>>) {
  const ticket = await w.kind.admit("r1", CHAT, chat("hi"));
  await w.kind.responseStart(ticket);
  const releaseSync = w.io.holdSyncs();
  const served = w.kind.record(ticket, { stagingKey: null, usage: null }).then(afterRecord(w.kind, ticket));
  const retire = refusalCode(w.call("retire", { checkpoint_id: "retire", episode_ids: [r1] }));
  await settle();
  w.clock.advance(10_000);
  expect(await retire).toBe("deadline_exceeded");
  expect({ aborted: ticket.abort.signal.aborted, open: w.kind.tickets.has(ticket.ticketId) }).toEqual({ aborted: true, open: true });
  return { releaseSync, served };
}

it("a forget after a retire cut short waits for the stopped call still writing its row, then lifts the fence", async () => {
  const w = await world();
  const { releaseSync, served } = await retireCutShortWhileRowSyncs(w);

  let answered = false;
  const forget = w.call("forget", { checkpoint_id: "forget", deadline_ts: T0 + 60, rollout_ids: ["r1"] }).finally(() => void (answered = true));
  await settle();
  expect({ answered, fenced: w.plane.isRetired(r1) }).toEqual({ answered: false, fenced: true });

  releaseSync();
  await served;
  expect(await forget).toEqual({ forgotten: ["r1"] });
  expect({ fenced: w.plane.isRetired(r1), inflight: w.kind.tickets.size }).toEqual({ fenced: false, inflight: 0 });
});

it("a forget whose wait for such a call outlives its deadline answers deadline_exceeded and lifts no fence", async () => {
  const w = await world();
  const { releaseSync, served } = await retireCutShortWhileRowSyncs(w);

  const forget = refusalCode(w.call("forget", { checkpoint_id: "forget", deadline_ts: T0 + 20, rollout_ids: ["r1"] }));
  await settle();
  w.clock.advance(10_000);
  expect(await forget).toBe("deadline_exceeded");
  expect(w.plane.isRetired(r1)).toBe(true);
  releaseSync();
  await served;
});

it("a forget waits for a call of the fenced attempt still being admitted, which is then refused, not admitted unfenced", async () => {
  const w = await world();
  // A row's write refused by the storage starts an outage: the next call's admission probes the storage first.
  const first = await w.kind.admit("r2", CHAT, chat("hi"));
  await w.kind.responseStart(first);
  w.io.failNextWrite = true;
  const failed = await w.kind.record(first, { stagingKey: null, usage: null }).catch((error: { code?: string }) => error.code);
  expect(failed).toBe("ENOSPC");

  const releaseProbe = w.io.holdSyncs();
  const admitting = w.kind.admit("r1", CHAT, chat("hi")); // past its first check, waiting for the probe
  const outcome = admitting.then(
    () => "admitted",
    (error: { code?: string }) => error.code ?? String(error),
  );
  await settle();

  // Nothing of r1 is open yet: the retire has nothing to stop and answers at once.
  expect(await w.call("retire", { checkpoint_id: "retire", episode_ids: [r1] })).toEqual({ retired: ["r1"] });
  let answered = false;
  const forget = w.call("forget", { checkpoint_id: "forget", deadline_ts: T0 + 60, rollout_ids: ["r1"] }).finally(() => void (answered = true));
  await settle();
  expect({ answered, fenced: w.plane.isRetired(r1) }).toEqual({ answered: false, fenced: true });

  releaseProbe();
  expect(await outcome).toBe("stale_attempt");
  expect(await forget).toEqual({ forgotten: ["r1"] });
  expect({ fenced: w.plane.isRetired(r1), inflight: w.kind.tickets.size }).toEqual({ fenced: false, inflight: 0 });
});

it("while a cut-short retire's removal still runs after a forget, new calls of every attempt it covers are refused, not only of the attempt it named", async () => {
  const w = await world();
  const r1a1 = { rollout_id: "r1", attempt: 1 };
  const ticket = await w.kind.admit("r1-a1", CHAT, chat("hi"));
  await w.kind.responseStart(ticket);
  const releaseSync = w.io.holdSyncs();
  const served = w.kind.record(ticket, { stagingKey: null, usage: null }).then(afterRecord(w.kind, ticket));
  const retire = refusalCode(w.call("retire", { checkpoint_id: "retire", episode_ids: [r1a1] }));
  await settle();
  w.clock.advance(10_000);
  expect(await retire).toBe("deadline_exceeded");

  // The retire's removal (attempts 0..1 of r1), once its stopped call closed, is held at its listing.
  const ledger = (w.kind as unknown as { ledger: { keysOfRollout: (id: string) => Promise<unknown> } }).ledger;
  const listing = ledger.keysOfRollout.bind(ledger);
  const gate = deferred();
  const listed = deferred();
  ledger.keysOfRollout = async (id) => {
    await gate.promise;
    try {
      return await listing(id);
    } finally {
      listed.resolve();
    }
  };

  const forget = w.call("forget", { checkpoint_id: "forget", deadline_ts: T0 + 60, rollout_ids: ["r1"] });
  releaseSync();
  await served;
  expect(await forget).toEqual({ forgotten: ["r1"] });
  expect(w.plane.isRetired(r1)).toBe(false);

  // The fence is lifted, the removal still runs: a call of attempt 0 would have its ledger removed under it.
  expect(await refusalCode(w.kind.admit("r1", CHAT, chat("hi")))).toBe("stale_attempt");
  expect(await refusalCode(w.kind.admit("r1-a1", CHAT, chat("hi")))).toBe("stale_attempt");

  gate.resolve();
  await listed.promise;
  // The removal's file work runs on the libuv pool: under load it can outlast any fixed number of turns.
  let admitted: AdmissionTicket | undefined;
  await waitUntil(async () => {
    admitted = await w.kind.admit("r1", CHAT, chat("hi")).catch(() => undefined);
    return admitted !== undefined;
  }, "a call of attempt 0 admitted once the retire's removal ended");
  w.kind.undelivered(admitted!);
});
