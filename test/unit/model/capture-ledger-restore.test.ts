import { closeSync, existsSync, writeSync } from "node:fs";
import { appendFile, mkdir, readFile, readdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CaptureLedger, ModelKind, type LedgerRow, type ModelRecord } from "../../../participants/kinds/model/index.js";
import { FsCheckpointStorage } from "../../../participants/storage/fs-storage.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { WriteGate } from "../../../participants/storage/write-gate.js";
import { CHAT, chat, deliveredCall, emptyRecords, modelFixture, type ModelFixture } from "./model-fixtures.js";
import { ep } from "../../support/episode.js";

let f: ModelFixture;
beforeEach(async () => {
  f = await modelFixture();
});
afterEach(async () => {
  await f.close();
});

const row = (capture_key: string, model_call_id: string, parent_call_id: string | null = null): LedgerRow => ({
  capture_key,
  model_call_id,
  parent_call_id,
  continued_from: null,
  route: CHAT,
  staging_key: `stage/${model_call_id}`,
  usage: null,
  recorded_at: 1,
});
const ledgerFile = (key: string) => join(f.dir, "ledger", `${key}.lineage.jsonl`);
const fileRows = async (key: string) =>
  (await readFile(ledgerFile(key), "utf8"))
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l).model_call_id);

describe("export", () => {
  it("refuses a null scope, leaves out undelivered calls, and exports an empty record for an episode with nothing", async () => {
    await expect(f.kind.exportRecords(null)).rejects.toMatchObject({ code: "invalid_request" });
    const delivered = await deliveredCall(f.kind, "ex");
    await f.kind.admit("ex", CHAT, chat("still generating"));
    const streaming = await f.kind.admit("ex", CHAT, chat("streaming"));
    await f.kind.responseStart(streaming);
    const records = await f.kind.exportRecords([ep("ex"), ep("nothing")]);
    expect(records.map((r) => [r.episode_id, r.rows.map((x) => x.model_call_id), r.generation_cuts])).toEqual([
      [ep("ex"), [delivered.modelCallId], []],
      [ep("nothing"), [], []],
    ]);
    // Another attempt of ex has nothing of attempt 0's (a scope names one attempt per rollout: the
    // highest is exported alone, see two-attempts-restore.test.ts).
    const later = await f.kind.exportRecords([ep("ex", 1)]);
    expect(later.map((r) => [r.episode_id, r.rows.length, r.generation_cuts])).toEqual([[ep("ex", 1), 0, []]]);
  });

  it("says so in its prepare report (scope_required), so the coordinator refuses a null scope before anyone commits", async () => {
    const plane = new ParticipantControlPlane({ adapter: f.kind, instance: "model0", checkpointRoot: join(f.dir, "checkpoints") });
    try {
      const request = { checkpoint_id: "c1", deadline_ts: Date.now() / 1000 + 30, epoch: 1 };
      const prepared = (await plane.handle("prepare", request)) as { report: { scope_required?: boolean } };
      expect(prepared.report.scope_required).toBe(true);
      await plane.handle("resume", request);
    } finally {
      plane.dispose();
    }
  });

  it("writes rows only after the backend acknowledged; a failed call leaves no row", async () => {
    const ticket = await f.kind.admit("ack", CHAT, chat("a"));
    await f.kind.responseStart(ticket);
    expect(existsSync(ledgerFile("ack"))).toBe(false);
    f.kind.fail(ticket);
    expect((await f.kind.captureManifest("ack")).records).toEqual([]);
    const ok = await deliveredCall(f.kind, "ack", "b", "stage/b");
    expect(await fileRows("ack")).toEqual([ok.modelCallId]);
  });
});

describe("restore: import as the next attempt, then retire the sources", () => {
  it("installs rows as attempt N+1's ledger, replacing target-and-later attempts, and retires attempts 0..N", async () => {
    // What earlier executions left on disk: the source attempt 1, an older attempt 0, a dead
    // replacement (attempt 2, with a call of its own) and an even later attempt 3.
    const ledger = new CaptureLedger(join(f.dir, "ledger"));
    await ledger.append(row("ro", "mc-old"));
    await ledger.append(row("ro-a1", "mc-src"));
    await ledger.append(row("ro-a2", "mc-src"));
    await ledger.append(row("ro-a2", "mc-dead", "mc-src"));
    await ledger.append(row("ro-a3", "mc-later"));
    await ledger.append(row("keep", "mc-keep"));
    await ledger.close();
    // The restoring process starts on that directory.
    await f.kind.close();
    f.kind = new ModelKind({ ledgerDir: join(f.dir, "ledger"), cutBackend: null });
    const record: ModelRecord = { episode_id: ep("ro", 1), rows: [row("ro-a1", "mc-src-0"), row("ro-a1", "mc-src", "mc-src-0")], generation_cuts: [] };
    await f.kind.install([record], {});
    expect(await fileRows("ro-a2")).toEqual(["mc-src-0", "mc-src"]);
    expect((await f.kind.captureManifest("ro-a2")).records.map((r) => r.model_call_id)).toEqual(["mc-src-0", "mc-src"]);
    const files = (await readdir(join(f.dir, "ledger"))).filter((n) => n.endsWith(".jsonl")).sort();
    expect(files).toEqual(["keep.lineage.jsonl", "ro-a2.lineage.jsonl"]);
    expect(f.kind.hasLiveState()).toBe(true);
    // The replacement's first call resolves its parent to the source's last delivered call.
    const first = await f.kind.admit("ro-a2", CHAT, chat("again"));
    expect(first.parentCallId).toBe("mc-src");
  });

  it("restoring the same record twice replaces what the first replacement wrote", async () => {
    const record: ModelRecord = { episode_id: ep("tw"), rows: [row("tw", "mc-1")], generation_cuts: [] };
    await f.kind.install([record], {});
    const dead = await deliveredCall(f.kind, "tw-a1");
    expect(dead.parentCallId).toBe("mc-1");
    // A fresh process on the same ledger directory, after the replacement crashed.
    await f.kind.close();
    const fresh = new ModelKind({ ledgerDir: join(f.dir, "ledger"), cutBackend: null });
    f.kind = fresh;
    await fresh.install([record], {});
    expect((await fresh.captureManifest("tw-a1")).records.map((r) => r.model_call_id)).toEqual(["mc-1"]);
    expect(await fileRows("tw-a1")).toEqual(["mc-1"]);
    const again = await fresh.admit("tw-a1", CHAT, chat("x"));
    expect(again.parentCallId).toBe("mc-1");
  });

  it("restoring twice an episode that had no model call at the checkpoint replaces what the first replacement wrote", async () => {
    // Its record is empty (the export keeps it, so the restore sees the episode) and imports no ledger.
    const [record] = await f.kind.exportRecords([ep("nc")]);
    expect(record).toEqual({ episode_id: ep("nc"), rows: [], generation_cuts: [] });
    const restart = async () => {
      await f.kind.close();
      f.kind = new ModelKind({ ledgerDir: join(f.dir, "ledger"), cutBackend: null });
    };
    await restart();
    await f.kind.install([record!], {});
    expect(existsSync(ledgerFile("nc-a1"))).toBe(false);
    expect(f.kind.hasLiveState()).toBe(false);
    const dead = await deliveredCall(f.kind, "nc-a1"); // the replacement calls, then crashes
    await restart();
    await f.kind.install([record!], {});
    expect(existsSync(ledgerFile("nc-a1"))).toBe(false);
    const again = await f.kind.admit("nc-a1", CHAT, chat("x"));
    expect(again.parentCallId, `the dead replacement's call ${dead.modelCallId} is not a parent`).toBeNull();
  });

  it("refuses a record whose next attempt is retired with stale_attempt, before writing anything", async () => {
    await deliveredCall(f.kind, "rt");
    await deliveredCall(f.kind, "rt-a1");
    const before = { source: await fileRows("rt"), target: await fileRows("rt-a1") };
    f.retired.add("rt#1");
    const ok: ModelRecord = { episode_id: ep("v1"), rows: [row("v1", "mc-a")], generation_cuts: [] };
    const retiredTarget: ModelRecord = { episode_id: ep("rt"), rows: [row("rt", "mc-checkpointed")], generation_cuts: [] };
    await expect(f.kind.install([ok, retiredTarget], {})).rejects.toMatchObject({ code: "stale_attempt" });
    expect({ source: await fileRows("rt"), target: await fileRows("rt-a1") }).toEqual(before);
    expect(existsSync(ledgerFile("v1-a1"))).toBe(false);
  });

  it("a restore through the control plane fences the source attempts: their calls are refused and recreate no ledger", async () => {
    const record: ModelRecord = { episode_id: ep("src"), rows: [row("src", "mc-1")], generation_cuts: [] };
    const dir = join(f.dir, "checkpoints");
    const target = { checkpointDir: join(dir, "c1"), checkpointId: "c1", kind: "model" as const, instance: "model0" };
    await new FsCheckpointStorage().write(target, [record], { gate: new WriteGate(), createdAt: 1, extra: {} });
    const plane = new ParticipantControlPlane({ adapter: f.kind, instance: "model0", checkpointRoot: dir });
    try {
      const request = { checkpoint_id: "c1", deadline_ts: Date.now() / 1000 + 30, epoch: 1 };
      await plane.handle("restore", { ...request, checkpoint_dir: target.checkpointDir, episode_ids: [ep("src"), ep("other")] });
      await plane.handle("resume", request);
      for (const key of ["src", "other"]) await expect(f.kind.admit(key, CHAT, chat("again"))).rejects.toMatchObject({ code: "stale_attempt" });
      expect(existsSync(ledgerFile("src"))).toBe(false);
      expect((await f.kind.admit("src-a1", CHAT, chat("continue"))).parentCallId).toBe("mc-1");
    } finally {
      plane.dispose();
    }
  });

  it("validates every record before writing anything", async () => {
    const ok: ModelRecord = { episode_id: ep("v1"), rows: [row("v1", "mc-a")], generation_cuts: [] };
    await expect(f.kind.install([ok, { ...ok, rows: [] }], {})).rejects.toMatchObject({ code: "invalid_checkpoint_state" });
    await expect(f.kind.install([ok, { episode_id: ep("v2"), rows: [{ ...row("v2", "mc-b"), route: "" }], generation_cuts: [] }], {})).rejects.toMatchObject({
      code: "invalid_checkpoint_state",
    });
    expect(existsSync(ledgerFile("v1-a1"))).toBe(false);
    expect(f.kind.hasLiveState()).toBe(false);
  });

  it("refuses a record holding rows of another rollout or a later attempt (invalid_checkpoint_state), installing nothing", async () => {
    await deliveredCall(f.kind, "own-a1"); // what a dead replacement left: a refused restore keeps it
    const before = await fileRows("own-a1");
    const ok: ModelRecord = { episode_id: ep("v1"), rows: [row("v1", "mc-a")], generation_cuts: [] };
    // A restored ledger exported again keeps its source's rows: attempt 0's rows in attempt 1's record are fine.
    const reexported: ModelRecord = { episode_id: ep("own", 1), rows: [row("own", "mc-0"), row("own-a1", "mc-1", "mc-0")], generation_cuts: [] };
    for (const foreign of [row("stranger", "mc-x"), row("own-a2", "mc-later")]) {
      const bad: ModelRecord = { ...reexported, rows: [...reexported.rows, foreign] };
      await expect(f.kind.install([ok, bad], {})).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining(foreign.capture_key) });
    }
    expect(existsSync(ledgerFile("v1-a1"))).toBe(false);
    expect(existsSync(ledgerFile("own-a2"))).toBe(false);
    expect(await fileRows("own-a1")).toEqual(before);
    await f.kind.install([reexported], {});
    expect(await fileRows("own-a2")).toEqual(["mc-0", "mc-1"]);
  });
});

describe("ledger retire and delete", () => {
  it("are refused while a checkpoint is open and change nothing", async () => {
    await deliveredCall(f.kind, "lr");
    await f.kind.closeAdmission();
    await expect(f.kind.retireLedgers(ep("lr"))).rejects.toMatchObject({ code: "invalid_phase", message: expect.stringMatching(/retry ledger retire and delete after resume/) });
    await expect(f.kind.deleteLedger("lr")).rejects.toMatchObject({ code: "invalid_phase" });
    expect((await f.kind.captureManifest("lr")).records).toHaveLength(1);
    expect(existsSync(ledgerFile("lr"))).toBe(true);
    await f.kind.openAdmission();
    await f.kind.deleteLedger("lr");
    expect((await f.kind.captureManifest("lr")).records).toEqual([]);
    expect(existsSync(ledgerFile("lr"))).toBe(false);
  });

  it("retire removes attempts 0..N of the rollout only", async () => {
    for (const key of ["rr", "rr-a1", "rr-a2", "rr2"]) await deliveredCall(f.kind, key);
    expect((await f.kind.retireLedgers(ep("rr", 1))).sort()).toEqual(["rr", "rr-a1"]);
    expect((await readdir(join(f.dir, "ledger"))).filter((n) => n.endsWith(".jsonl")).sort()).toEqual(["rr-a2.lineage.jsonl", "rr2.lineage.jsonl"]);
    await expect(f.kind.deleteLedger("../x")).rejects.toMatchObject({ code: "invalid_request" });
  });

  it("the ledger retire API stops the attempts' in-flight calls first, so no late row recreates a ledger", async () => {
    await deliveredCall(f.kind, "api");
    const inflight = await f.kind.admit("api-a1", CHAT, chat("x"));
    await f.kind.responseStart(inflight);
    const untouched = await f.kind.admit("api-a2", CHAT, chat("y"));
    const retiring = f.kind.retireLedgers(ep("api", 1));
    expect(inflight.abort.signal.aborted).toBe(true);
    expect(untouched.abort.signal.aborted).toBe(false);
    // Calls of the attempts being removed are refused meanwhile; the backend's late answer writes nothing.
    await expect(f.kind.admit("api", CHAT, chat("z"))).rejects.toMatchObject({ code: "stale_attempt" });
    await f.kind.complete(inflight, { stagingKey: "stage/late", usage: null });
    expect((await retiring).sort()).toEqual(["api", "api-a1"]);
    expect(existsSync(ledgerFile("api-a1"))).toBe(false);
    expect(existsSync(ledgerFile("api"))).toBe(false);
    // Once removed, the key may be used again.
    expect((await f.kind.admit("api", CHAT, chat("again"))).parentCallId).toBeNull();
  });

  it("the ledger delete API stops that key's in-flight call first", async () => {
    await deliveredCall(f.kind, "del");
    const inflight = await f.kind.admit("del", CHAT, chat("x"));
    await f.kind.responseStart(inflight);
    const other = await f.kind.admit("del-a1", CHAT, chat("y"));
    const deleting = f.kind.deleteLedger("del");
    expect([inflight.abort.signal.aborted, other.abort.signal.aborted]).toEqual([true, false]);
    await f.kind.complete(inflight, { stagingKey: "stage/late", usage: null });
    await deleting;
    expect(existsSync(ledgerFile("del"))).toBe(false);
    expect((await f.kind.captureManifest("del")).records).toEqual([]);
  });

  it("a ledger removal whose calls stopped while a checkpoint opened is refused with invalid_phase and removes nothing", async () => {
    await deliveredCall(f.kind, "race");
    const inflight = await f.kind.admit("race", CHAT, chat("x"));
    const deleting = f.kind.deleteLedger("race");
    await f.kind.closeAdmission();
    f.kind.fail(inflight);
    await expect(deleting).rejects.toMatchObject({ code: "invalid_phase" });
    expect(existsSync(ledgerFile("race"))).toBe(true);
    await f.kind.openAdmission();
  });

  it("a checkpoint retire stops in-flight calls first so no late row recreates the ledger", async () => {
    await deliveredCall(f.kind, "late");
    const inflight = await f.kind.admit("late", CHAT, chat("x"));
    await f.kind.responseStart(inflight);
    const retiring = f.kind.retire([ep("late")]);
    // The proxy sees the abort and the backend's answer arrives anyway: no row is written.
    await f.kind.complete(inflight, { stagingKey: "stage/late", usage: null });
    await retiring;
    expect((await f.kind.captureManifest("late")).records).toEqual([]);
    expect(existsSync(ledgerFile("late"))).toBe(false);
  });

  it("a retire of attempt N stops the in-flight calls of earlier attempts too", async () => {
    await deliveredCall(f.kind, "early");
    const inflight = await f.kind.admit("early", CHAT, chat("x")); // attempt 0, still generating
    await f.kind.responseStart(inflight);
    const retiring = f.kind.retire([ep("early", 1)]);
    expect(inflight.abort.signal.aborted).toBe(true);
    await f.kind.complete(inflight, { stagingKey: "stage/early", usage: null });
    await retiring;
    expect(existsSync(ledgerFile("early"))).toBe(false);
  });
});

describe("ledger files", () => {
  it("drop a torn last line on load", async () => {
    const path = ledgerFile("torn");
    await mkdir(join(f.dir, "ledger"), { recursive: true }); // the fixture's ledger may not have created it yet
    await writeFile(path, `${JSON.stringify(row("torn", "mc-1"))}\n`);
    await appendFile(path, '{"capture_key":"torn","model_');
    const ledger = new CaptureLedger(join(f.dir, "ledger"));
    expect((await ledger.rows("torn")).map((r) => r.model_call_id)).toEqual(["mc-1"]);
    // The next append starts on a line of its own, so it survives a reload.
    await ledger.append(row("torn", "mc-2"));
    await ledger.close();
    const reloaded = new CaptureLedger(join(f.dir, "ledger"));
    expect((await reloaded.rows("torn")).map((r) => r.model_call_id)).toEqual(["mc-1", "mc-2"]);
    await reloaded.close();
  });

  it("cut a torn last line at its byte offset even after a damaged line that is not UTF-8: the next row stays readable", async () => {
    const path = ledgerFile("bin");
    await mkdir(join(f.dir, "ledger"), { recursive: true });
    await writeFile(
      path,
      Buffer.concat([
        Buffer.from(`${JSON.stringify(row("bin", "mc-1"))}\n`),
        Buffer.from([0xff, 0xfe, 0xff, 0xfe, 0x0a]), // damage from outside: 4 bytes that are not UTF-8 (each decodes to 3)
        Buffer.from(`${JSON.stringify(row("bin", "mc-2"))}\n`),
        Buffer.from('{"capture_key":"bin","model_call_id":"mc-3","par'), // a crash cut the last append short
      ]),
    );
    const ledger = new CaptureLedger(join(f.dir, "ledger"));
    expect((await ledger.load("bin")).rows.map((r) => r.model_call_id)).toEqual(["mc-1", "mc-2"]);
    await ledger.append(row("bin", "mc-4"));
    await ledger.close();
    const reloaded = new CaptureLedger(join(f.dir, "ledger"));
    const loaded = await reloaded.load("bin");
    await reloaded.close();
    expect(loaded).toMatchObject({ corrupt: [2] });
    expect(loaded.rows.map((r) => r.model_call_id)).toEqual(["mc-1", "mc-2", "mc-4"]);
  });

  it("a corrupt line in the middle leaves the key usable: new calls continue, export and manifest refuse with invalid_checkpoint_state", async () => {
    await mkdir(join(f.dir, "ledger"), { recursive: true });
    await writeFile(ledgerFile("mid"), `${JSON.stringify(row("mid", "mc-1"))}\n{"capture_key":"mid","mo\n${JSON.stringify(row("mid", "mc-3"))}\n{"not":"a row"}\n`);
    const reported: [string, number[]][] = [];
    const ledger = new CaptureLedger(join(f.dir, "ledger"), 16, 256, { onCorrupt: (path, lines) => reported.push([path, lines]) });
    expect((await ledger.rows("mid")).map((r) => r.model_call_id)).toEqual(["mc-1", "mc-3"]);
    expect((await ledger.load("mid")).corrupt).toEqual([2, 4]);
    expect(reported).toEqual([[ledgerFile("mid"), [2, 4]]]);
    await ledger.close();
    // A model kind started on that directory: a new call's parent is the last readable row, and its row is kept.
    await f.kind.close();
    f.kind = new ModelKind({ ledgerDir: join(f.dir, "ledger"), cutBackend: null });
    const call = await deliveredCall(f.kind, "mid");
    expect(call.parentCallId).toBe("mc-3");
    expect(await fileRows("mid").catch(() => "unparseable")).toBe("unparseable"); // the damage stays for the operator
    await expect(f.kind.exportRecords([ep("mid")])).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringMatching(/2 unreadable line\(s\) \(2, 4\)/) });
    await expect(f.kind.captureManifest("mid")).rejects.toMatchObject({ code: "invalid_checkpoint_state" });
    // Other keys export as before; a retire clears the damaged ledger.
    await deliveredCall(f.kind, "fine");
    expect((await f.kind.exportRecords([ep("fine")])).map((r) => r.rows.length)).toEqual([1]);
    await f.kind.retireLedgers(ep("mid"));
    expect(await f.kind.exportRecords([ep("mid")])).toEqual(emptyRecords(ep("mid")));
  });

  it("a write that fails part way is cut off: the file and memory keep nothing of it, later appends stay readable", async () => {
    let failNext = false;
    const ledger = new CaptureLedger(join(f.dir, "ledger"), 16, 256, {
      write: (fd, buffer, offset) => {
        if (!failNext) return writeSync(fd, buffer, offset);
        failNext = false;
        writeSync(fd, buffer.subarray(offset, offset + 20)); // a torn prefix reaches the file…
        throw Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC", syscall: "write" }); // …then the disk is full
      },
    });
    await ledger.append(row("full", "mc-1"));
    expect((await ledger.rows("full")).map((r) => r.model_call_id)).toEqual(["mc-1"]);
    const size = (await readFile(ledgerFile("full"))).length;
    failNext = true;
    // Named with its file: a write on a descriptor names no path, and the proxy's "ledger row write
    // failed" line would not say which disk is full.
    await expect(ledger.append(row("full", "mc-2"))).rejects.toMatchObject({ code: "ENOSPC", path: ledgerFile("full") });
    expect((await readFile(ledgerFile("full"))).length).toBe(size);
    expect((await ledger.rows("full")).map((r) => r.model_call_id)).toEqual(["mc-1"]);
    await ledger.append(row("full", "mc-3"));
    await ledger.close();
    const reloaded = new CaptureLedger(join(f.dir, "ledger"));
    expect((await reloaded.rows("full")).map((r) => r.model_call_id)).toEqual(["mc-1", "mc-3"]);
    expect((await reloaded.load("full")).corrupt).toEqual([]);
    await reloaded.close();
  });

  it("a failed write that cannot even be cut off is cut before the key's next append", async () => {
    let failNext = false;
    const ledger = new CaptureLedger(join(f.dir, "ledger"), 16, 256, {
      write: (fd, buffer, offset) => {
        if (!failNext) return writeSync(fd, buffer, offset);
        failNext = false;
        writeSync(fd, buffer.subarray(offset, offset + 20));
        closeSync(fd); // the descriptor is gone: truncating through it fails too
        throw Object.assign(new Error("EIO: i/o error, write"), { code: "EIO" });
      },
    });
    await ledger.append(row("eio", "mc-1"));
    failNext = true;
    await expect(ledger.append(row("eio", "mc-2"))).rejects.toThrow(/EIO/);
    expect((await ledger.rows("eio")).map((r) => r.model_call_id)).toEqual(["mc-1"]);
    await ledger.append(row("eio", "mc-3"));
    expect(await fileRows("eio")).toEqual(["mc-1", "mc-3"]);
    await ledger.close();
  });

  it("a call whose row cannot be written fails: no row, the ticket closes, the next call's parent is the last written row", async () => {
    let fail = false;
    const g = new ModelKind({
      ledgerDir: join(f.dir, "ledger-g"),
      cutBackend: null,
      ledgerWrite: (fd, buffer, offset) => {
        if (fail) throw Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC" });
        return writeSync(fd, buffer, offset);
      },
    });
    try {
      const first = await deliveredCall(g, "nospace");
      fail = true;
      await expect(deliveredCall(g, "nospace")).rejects.toThrow(/ENOSPC/);
      expect(g.tickets.size).toBe(0);
      expect(g.readiness().blockers).toEqual([]);
      fail = false;
      const next = await deliveredCall(g, "nospace");
      expect(next.parentCallId).toBe(first.modelCallId);
      expect((await g.captureManifest("nospace")).records.map((r) => r.model_call_id)).toEqual([first.modelCallId, next.modelCallId]);
    } finally {
      await g.close();
    }
  });

  it("keep a bounded number of rows in memory: finished rollouts leave it, and read back from their files when used", async () => {
    const ledger = new CaptureLedger(join(f.dir, "ledger"), 16, 256, { maxCachedRows: 10 });
    for (let r = 0; r < 40; r++) {
      const key = `bound-${r}`;
      await ledger.rows(key); // a call's admission loads the key
      for (let i = 0; i < 3; i++) await ledger.append(row(key, `mc-${r}-${i}`, i ? `mc-${r}-${i - 1}` : null));
      expect(ledger.cacheSize().rows).toBeLessThanOrEqual(10);
    }
    expect(ledger.cacheSize()).toMatchObject({ keys: 3 });
    // An early rollout is read back whole from its file, and appends to it go on as before.
    expect((await ledger.rows("bound-0")).map((r) => r.model_call_id)).toEqual(["mc-0-0", "mc-0-1", "mc-0-2"]);
    await ledger.append(row("bound-0", "mc-0-3", "mc-0-2"));
    expect((await ledger.rows("bound-0")).map((r) => r.model_call_id)).toEqual(["mc-0-0", "mc-0-1", "mc-0-2", "mc-0-3"]);
    expect(ledger.cacheSize().rows).toBeLessThanOrEqual(10);
    // Keys without rows count too: a stream of first calls that never complete stays bounded.
    for (let r = 0; r < 100; r++) await ledger.rows(`empty-${r}`);
    expect(ledger.cacheSize().keys).toBeLessThanOrEqual(10);
    await ledger.close();
  });

  it("the model kind keeps its ledger memory bounded and still exports every delivered row and parent", async () => {
    await f.kind.close();
    f.kind = new ModelKind({ ledgerDir: join(f.dir, "ledger"), cutBackend: null, ledgerCacheRows: 5 });
    const expected = new Map<string, string[]>();
    for (let r = 0; r < 20; r++) {
      const calls: string[] = [];
      for (let i = 0; i < 2; i++) {
        const t = await deliveredCall(f.kind, `mem-${r}`, `q${i}`);
        expect(t.parentCallId).toBe(calls.at(-1) ?? null);
        calls.push(t.modelCallId);
      }
      expected.set(`mem-${r}`, calls);
    }
    expect(f.kind.ledger.cacheSize().rows).toBeLessThanOrEqual(5);
    const records = await f.kind.exportRecords([...expected.keys()].map((k) => ep(k)));
    expect(new Map(records.map((rec) => [rec.episode_id.rollout_id, rec.rows.map((x) => x.model_call_id)]))).toEqual(expected);
    expect(f.kind.ledger.cacheSize().rows).toBeLessThanOrEqual(5);
  });

  it("retract takes back one row and keeps every other line as it is", async () => {
    await mkdir(join(f.dir, "ledger"), { recursive: true });
    const damaged = '{"capture_key":"rt","mo';
    await writeFile(ledgerFile("rt"), `${JSON.stringify(row("rt", "mc-1"))}\n${damaged}\n${JSON.stringify(row("rt", "mc-2"))}\n`);
    const ledger = new CaptureLedger(join(f.dir, "ledger"));
    await ledger.append(row("rt", "mc-3", "mc-2"));
    expect(await ledger.retract("rt", "mc-2")).toBe(true);
    expect(await ledger.retract("rt", "mc-nope")).toBe(false);
    expect(await ledger.retract("rt-a9", "mc-1")).toBe(false);
    expect((await readFile(ledgerFile("rt"), "utf8")).split("\n")[1]).toBe(damaged);
    expect(await ledger.load("rt")).toMatchObject({ corrupt: [2] });
    expect((await ledger.rows("rt")).map((r) => r.model_call_id)).toEqual(["mc-1", "mc-3"]);
    await ledger.append(row("rt", "mc-4", "mc-3"));
    expect((await ledger.rows("rt")).map((r) => r.model_call_id)).toEqual(["mc-1", "mc-3", "mc-4"]);
    await ledger.close();
  });

  it("retract keeps a damaged line that is not UTF-8 byte for byte", async () => {
    await mkdir(join(f.dir, "ledger"), { recursive: true });
    const damaged = Buffer.from([0xff, 0xfe, 0x7b, 0xc3]);
    const line = (id: string) => Buffer.from(`${JSON.stringify(row("rb", id))}\n`);
    await writeFile(ledgerFile("rb"), Buffer.concat([line("mc-1"), damaged, Buffer.from("\n"), line("mc-2")]));
    const ledger = new CaptureLedger(join(f.dir, "ledger"));
    expect(await ledger.retract("rb", "mc-2")).toBe(true);
    await ledger.close();
    expect(await readFile(ledgerFile("rb"))).toEqual(Buffer.concat([line("mc-1"), damaged, Buffer.from("\n")]));
  });

  it("reject rows that do not match the schema", async () => {
    const ledger = new CaptureLedger(join(f.dir, "ledger"));
    // Refused by the row schema itself (a ZodError naming the field), not by a later check on the key's file name.
    await expect(ledger.append({ ...row("bad", "mc-1"), extra: 1 } as LedgerRow)).rejects.toMatchObject({ name: "ZodError", issues: [expect.objectContaining({ code: "unrecognized_keys", keys: ["extra"] })] });
    await expect(ledger.append(row("not a key/..", "mc-1"))).rejects.toMatchObject({ name: "ZodError", issues: [expect.objectContaining({ path: ["capture_key"], message: "not a valid capture key" })] });
    await ledger.close();
  });
});
