import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, readdirSync, writeSync } from "node:fs";
import { lstat, mkdir, mkdtemp, readFile, readdir, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CaptureLedger, StripedLocks } from "../../../participants/kinds/model/index.js";
import { mulberry32 } from "../../support/seeded-random.js";
import { isPending, ledgerRow, settle } from "./model-fixtures.js";
import { deferred } from "../../support/deferred.js";

let dir: string;
const open: { close(): Promise<void> }[] = [];
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-locks-"));
});
afterEach(async () => {
  for (const item of open.splice(0)) await item.close();
  await rm(dir, { recursive: true, force: true });
});

function locks(stripes: number, waitMs = 10_000, idleMs = 60_000): StripedLocks {
  const l = new StripedLocks(join(dir, "locks"), stripes, waitMs, idleMs);
  open.push(l);
  return l;
}

/** Two distinct keys that hash to the same stripe, and one that does not. */
function keysOnOneStripe(l: StripedLocks): { a: string; b: string; other: string } {
  const first = "rollout-0";
  for (let i = 1; i < 10_000; i++) {
    if (l.stripeOf(`rollout-${i}`) === l.stripeOf(first)) {
      for (let j = 1; j < 10_000; j++) if (l.stripeOf(`other-${j}`) !== l.stripeOf(first)) return { a: first, b: `rollout-${i}`, other: `other-${j}` };
    }
  }
  throw new Error("no collision found");
}


describe("striped ledger locks", () => {
  it("map keys to a stable stripe in range (FNV-1a)", () => {
    const l = locks(16);
    expect(l.stripeOf("rollout-0")).toBe(l.stripeOf("rollout-0"));
    const stripes = new Set(Array.from({ length: 1000 }, (_, i) => l.stripeOf(`r-${i}`)));
    expect([...stripes].every((s) => s >= 0 && s < 16)).toBe(true);
    expect(stripes.size).toBe(16);
    expect(new StripedLocks(join(dir, "x"), 16).stripeOf("abc")).toBe(l.stripeOf("abc"));
    expect(l.lockFile(3)).toBe(join(dir, "locks", "stripe-0003.lock"));
    expect(() => new StripedLocks(dir, 0)).toThrow(/stripes/);
    expect(() => new StripedLocks(dir, 1025)).toThrow(/stripes/);
  });

  it("keep a bounded number of lock files however many rollouts write", async () => {
    const ledger = new CaptureLedger(join(dir, "ledger"), 4);
    open.push(ledger);
    for (let i = 0; i < 300; i++) {
      await ledger.append({ capture_key: `roll-${i}`, model_call_id: `mc-${i}`, parent_call_id: null, continued_from: null, route: "/v1/chat/completions", staging_key: null, usage: null, recorded_at: i });
    }
    // Lock files, and the one owner file they are hard links to.
    const files = await readdir(join(dir, "ledger", "locks"));
    const lockFiles = files.filter((n) => !n.startsWith(".owner-"));
    expect(lockFiles.length).toBeLessThanOrEqual(4);
    expect(lockFiles.every((n) => /^stripe-000[0-3]\.lock$/.test(n))).toBe(true);
    expect(files.filter((n) => n.startsWith(".owner-"))).toEqual([expect.stringMatching(/^\.owner-[0-9a-f]{12}$/)]);
    expect((await readdir(join(dir, "ledger"))).filter((n) => n.endsWith(".lineage.jsonl"))).toHaveLength(300);
  });

  it("serialize two keys on one stripe; keys on other stripes proceed", async () => {
    const l = locks(8);
    const { a, b, other } = keysOnOneStripe(l);
    const gate = deferred();
    const started = deferred();
    const order: string[] = [];
    const first = l.run(a, async () => {
      order.push("a:start");
      started.resolve();
      await gate.promise;
      order.push("a:end");
    });
    // Taking the stripe's lock file is file I/O: wait for it rather than for a number of turns.
    await started.promise;
    const second = l.run(b, async () => void order.push("b"));
    const third = l.run(other, async () => void order.push("other"));
    await third;
    await settle();
    expect(isPending(second)()).toBe(true);
    expect(order).toEqual(["a:start", "other"]);
    gate.resolve();
    await Promise.all([first, second]);
    expect(order).toEqual(["a:start", "other", "a:end", "b"]);
  });

  it("own a stripe across processes through its lock file holding the pid, released when idle", async () => {
    const l = locks(4, 10_000, 30);
    const file = l.lockFile(l.stripeOf("k"));
    // Checked inside the run, while the stripe is busy: after it, a loaded machine may already be
    // past the 30 ms idle release.
    await l.run("k", async () => {
      expect(await readFile(file, "utf8")).toMatch(new RegExp(`^${process.pid} [0-9a-f]{16} [0-9]+ [0-9a-f-]{36}$`));
      expect(l.ownedStripes()).toEqual([l.stripeOf("k")]);
    });
    // Reused without touching the file system while busy, released after idleMs. The stripe is
    // dropped from the owned set only once its unlink returned: the file may be gone a moment before.
    for (let i = 0; i < 250 && (existsSync(file) || l.ownedStripes().length > 0); i++) await new Promise((resolve) => setTimeout(resolve, 20));
    expect(existsSync(file)).toBe(false);
    expect(l.ownedStripes()).toEqual([]);
  });

  it("wait for a stripe held by another live process, and give up after the wait", async () => {
    const l = locks(4, 150);
    await mkdir(join(dir, "locks"), { recursive: true });
    await writeFile(l.lockFile(l.stripeOf("k")), String(process.ppid));
    await expect(l.run("k", async () => "ran")).rejects.toThrow(/^ledger lock stripe-\d{4}\.lock is held by another live process$/);
    expect(await readFile(l.lockFile(l.stripeOf("k")), "utf8")).toBe(String(process.ppid));
  });

  it("break a lock file whose owner died", async () => {
    const dead = spawnSync(process.execPath, ["-e", ""]).pid!;
    const l = locks(4, 2_000);
    await mkdir(join(dir, "locks"), { recursive: true });
    await writeFile(l.lockFile(l.stripeOf("k")), String(dead));
    expect(await l.run("k", async () => "ran")).toBe("ran");
    expect(await readFile(l.lockFile(l.stripeOf("k")), "utf8")).toMatch(new RegExp(`^${process.pid} `));
  });

  it("break a lock file naming this pid that another process wrote (a restarted container is PID 1 again)", async () => {
    const l = locks(4, 2_000);
    await mkdir(join(dir, "locks"), { recursive: true });
    await writeFile(l.lockFile(l.stripeOf("k")), `${process.pid} 0123456789abcdef`);
    await writeFile(l.lockFile(l.stripeOf("k2")), String(process.pid)); // the format before tokens
    expect(await l.run("k", async () => "ran")).toBe("ran");
    expect(await l.run("k2", async () => "ran")).toBe("ran");
  });

  it("break a lock file whose owner died although an unrelated live process now has its pid; respect one whose owner still runs", async () => {
    const stat = (pid: number) => readFileSync(`/proc/${pid}/stat`, "utf8");
    const startOf = (pid: number) => stat(pid).slice(stat(pid).lastIndexOf(")") + 2).split(" ")[19]!;
    const bootId = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
    const l = locks(4, 150);
    await mkdir(join(dir, "locks"), { recursive: true });
    // The parent (alive) with another start time: the owner that wrote this died, its pid was reused.
    const ppid = process.ppid;
    await writeFile(l.lockFile(l.stripeOf("k")), `${ppid} 0123456789abcdef ${Number(startOf(ppid)) + 1} ${bootId}`);
    expect(await l.run("k", async () => "ran")).toBe("ran");
    // Written before a reboot: nobody from then runs.
    await writeFile(l.lockFile(l.stripeOf("k2")), `${ppid} 0123456789abcdef ${startOf(ppid)} 00000000-0000-0000-0000-000000000000`);
    expect(await l.run("k2", async () => "ran")).toBe("ran");
    // The parent itself, as it is: a live owner, waited for.
    const held = `${ppid} 0123456789abcdef ${startOf(ppid)} ${bootId}`;
    await writeFile(l.lockFile(l.stripeOf("k3")), held);
    await expect(l.run("k3", async () => "ran")).rejects.toThrow(/held by another live process/);
    expect(await readFile(l.lockFile(l.stripeOf("k3")), "utf8")).toBe(held);
  });

  it("wait for a stripe another ledger of this process holds", async () => {
    const first = locks(4);
    await first.run("k", async () => undefined);
    const second = locks(4, 150);
    await expect(second.run("k", async () => "ran")).rejects.toThrow(/held by another live process/);
  });

  it("break an empty lock file left by a writer that died between create and write, once it is old", async () => {
    const l = locks(4, 2_000);
    await mkdir(join(dir, "locks"), { recursive: true });
    const file = l.lockFile(l.stripeOf("k"));
    await writeFile(file, "");
    const past = new Date(Date.now() - 60_000);
    await utimes(file, past, past);
    expect(await l.run("k", async () => "ran")).toBe("ran");
  });

  it("lock files are hard links to one owner file written once; owner files of processes that no longer run are removed, live ones kept", async () => {
    const stat = (pid: number) => readFileSync(`/proc/${pid}/stat`, "utf8");
    const startOf = (pid: number) => stat(pid).slice(stat(pid).lastIndexOf(")") + 2).split(" ")[19]!;
    const bootId = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
    const dead = spawnSync(process.execPath, ["-e", ""]).pid!;
    await mkdir(join(dir, "locks"), { recursive: true });
    // A crashed process's owner file, and a live one's (the parent, as it is).
    const live = `${process.ppid} 0123456789abcdef ${startOf(process.ppid)} ${bootId}`;
    await writeFile(join(dir, "locks", ".owner-000000000000"), `${dead} 0123456789abcdef`);
    await writeFile(join(dir, "locks", ".owner-111111111111"), live);
    const l = locks(4);
    await l.run("a", async () => undefined);
    await l.run("zz", async () => undefined);
    const files = (await readdir(join(dir, "locks"))).sort();
    const mine = files.filter((n) => n.startsWith(".owner-") && n !== ".owner-111111111111");
    expect(mine).toHaveLength(1);
    expect(files).toEqual([...mine, ".owner-111111111111", ...l.ownedStripes().map((s) => `stripe-000${s}.lock`)].sort());
    const owner = await lstat(join(dir, "locks", mine[0]!));
    for (const s of l.ownedStripes()) expect((await lstat(l.lockFile(s))).ino).toBe(owner.ino);
    expect(await readFile(join(dir, "locks", ".owner-111111111111"), "utf8")).toBe(live);
    await l.close();
    expect(await readdir(join(dir, "locks"))).toEqual([".owner-111111111111"]);
  });

  it("a process that exits holding stripes, without close(), leaves neither lock files nor its owner file", () => {
    const module = fileURLToPath(new URL("../../../participants/kinds/model/striped-locks.ts", import.meta.url));
    const program = `import { StripedLocks } from ${JSON.stringify(module)};
const l = new StripedLocks(${JSON.stringify(join(dir, "locks"))}, 4, 10_000, 60_000);
await l.run("a", async () => undefined);
await l.run("zz", async () => undefined);
console.log(l.ownedStripes().length);
process.exit(0);`;
    const child = spawnSync(process.execPath, ["--import", "tsx", "--input-type=module", "-e", program], { encoding: "utf8", timeout: 30_000 });
    expect({ status: child.status, stderr: child.stderr }).toEqual({ status: 0, stderr: "" });
    expect(Number(child.stdout.trim())).toBeGreaterThan(0);
    expect(readdirSync(join(dir, "locks"))).toEqual([]);
  });

  it("a clock probe a crash left in the lock directory (an empty file's age is read off one) is removed once old; a fresh one stays", async () => {
    const l = locks(4);
    await mkdir(join(dir, "locks"), { recursive: true });
    const stale = ".clock-probe.999999999.0123456789ab";
    const fresh = ".clock-probe.999999999.0123456789ac";
    await writeFile(join(dir, "locks", stale), "");
    const old = new Date(Date.now() - 120_000);
    await utimes(join(dir, "locks", stale), old, old);
    await writeFile(join(dir, "locks", fresh), "");
    await l.run("k", async () => undefined);
    expect((await readdir(join(dir, "locks"))).filter((name) => name.startsWith(".clock-probe."))).toEqual([fresh]);
  });

  it("an owner file removed from outside is written again", async () => {
    const l = locks(4, 10_000, 30);
    await l.run("a", async () => undefined);
    const [owner] = (await readdir(join(dir, "locks"))).filter((n) => n.startsWith(".owner-"));
    await rm(join(dir, "locks", owner!));
    // Another stripe: its lock file needs the owner file again.
    const other = ["b", "c", "d", "e", "f", "g"].find((k) => l.stripeOf(k) !== l.stripeOf("a"))!;
    expect(await l.run(other, async () => "ran")).toBe("ran");
    expect(await readFile(l.lockFile(l.stripeOf(other)), "utf8")).toMatch(new RegExp(`^${process.pid} `));
    expect((await readdir(join(dir, "locks"))).filter((n) => n.startsWith(".owner-"))).toEqual([owner]);
  });

  it("close() right after construction returns only once the directory exists, so a caller may remove the tree at once", async () => {
    const l = new StripedLocks(join(dir, "fresh", "locks"), 4);
    await l.close();
    // Its mkdir was in flight: returning earlier let it create entries while the caller removed the tree (ENOTEMPTY).
    expect(existsSync(join(dir, "fresh", "locks"))).toBe(true);
  });

  it("close() releases every owned stripe and refuses further use", async () => {
    const l = new StripedLocks(join(dir, "locks"), 4);
    await l.run("a", async () => undefined);
    await l.run("zz", async () => undefined);
    expect((await readdir(join(dir, "locks"))).length).toBe(l.ownedStripes().length + 1); // and the owner file
    await l.close();
    expect(await readdir(join(dir, "locks"))).toEqual([]);
    await expect(l.run("a", async () => undefined)).rejects.toThrow(/closed/);
  });

  it("close() lets the work queued before it finish, then releases every stripe; later work is refused", async () => {
    const l = new StripedLocks(join(dir, "locks"), 4);
    const gate = deferred();
    const started = deferred();
    const first = l.run("a", async () => {
      started.resolve();
      await gate.promise;
      return 1;
    });
    await started.promise;
    const queued = l.run("a", async () => 2); // waits behind the first on the same stripe
    const elsewhere = l.run("zz", async () => 3);
    const closing = l.close();
    await expect(l.run("a", async () => 4)).rejects.toThrow(/closed/);
    gate.resolve();
    expect(await Promise.all([first, queued, elsewhere])).toEqual([1, 2, 3]);
    await closing;
    expect(await readdir(join(dir, "locks"))).toEqual([]);
    expect(l.ownedStripes()).toEqual([]);
  });

  it("run a synchronous section at once only on an owned, free stripe with nothing else pending (the ledger row's hot path)", async () => {
    const l = locks(8);
    const { a, b, other } = keysOnOneStripe(l);
    const ran: string[] = [];
    // Not owned yet: taking the lock file is file I/O, which only run() does.
    expect(l.runNowIfFree(a, () => void ran.push("first"))).toBe(false);
    await l.run(a, async () => undefined);
    expect(l.runNowIfFree(b, () => void ran.push("owned"))).toBe(true);
    expect(ran).toEqual(["owned"]);
    // Work run() accepted and not settled, on this stripe or another, goes first: nothing overtakes it.
    const gate = deferred();
    const started = deferred();
    const holding = l.run(other, async () => {
      started.resolve();
      await gate.promise;
    });
    try {
      expect(l.runNowIfFree(a, () => void ran.push("beside pending work"))).toBe(false);
      await started.promise;
      expect(l.runNowIfFree(a, () => void ran.push("beside running work"))).toBe(false);
    } finally {
      gate.resolve();
      await holding;
    }
    expect(l.runNowIfFree(a, () => void ran.push("free again"))).toBe(true);
    // A throwing section passes its error on; the stripe stays usable.
    expect(() => l.runNowIfFree(a, () => { throw new Error("disk full"); })).toThrow("disk full");
    expect(await l.run(a, async () => "still usable")).toBe("still usable");
    await l.close();
    expect(l.runNowIfFree(a, () => void ran.push("closed"))).toBe(false);
    expect(ran).toEqual(["owned", "free again"]);
  });

  it("a ledger append never overtakes a replace asked for before it (same key, file open for appends)", async () => {
    const ledger = new CaptureLedger(join(dir, "ledger"), 4);
    open.push(ledger);
    await ledger.append(ledgerRow("order", "mc-1"));
    await ledger.append(ledgerRow("order", "mc-2"));
    // Asked for in this order without waiting: the replace (locked, file I/O) first, then the append.
    const replacing = ledger.replace("order", [ledgerRow("order", "mc-restored")]);
    const appending = ledger.append(ledgerRow("order", "mc-3"));
    await Promise.all([replacing, appending]);
    const lines = (await readFile(join(dir, "ledger", "order.lineage.jsonl"), "utf8")).split("\n").filter(Boolean);
    expect(lines.map((line) => JSON.parse(line).model_call_id)).toEqual(["mc-restored", "mc-3"]);
    expect((await ledger.rows("order")).map((r) => r.model_call_id)).toEqual(["mc-restored", "mc-3"]);
  });

  it("ledger operations asked for without waiting apply in the order asked, per key, whichever take the immediate path (seeded interleavings)", async () => {
    const random = mulberry32(0x1ed9e7);
    const pick = <T,>(items: readonly T[]): T => items[Math.floor(random() * items.length)]!;
    const keys = ["ra-0", "rb-0", "rc-0", "rd-1"];
    const failing = new Set<string>(); // rows whose write fails part way (a full disk)
    const write = (fd: number, buffer: Buffer, offset: number) => {
      const id = /"model_call_id":"([^"]+)"/.exec(buffer.toString("utf8"))?.[1];
      if (id !== undefined && failing.delete(id)) {
        writeSync(fd, buffer, offset, Math.min(5, buffer.length - offset));
        throw Object.assign(new Error("no space left"), { code: "ENOSPC" });
      }
      return writeSync(fd, buffer, offset);
    };
    // Two stripes and three append handles for four keys: keys share stripes and evict each other's descriptors.
    const ledger = new CaptureLedger(join(dir, "ledger"), 2, 3, { write });
    open.push(ledger);
    const expected = new Map<string, string[]>(keys.map((k) => [k, []]));
    let immediate = 0;
    const runNowIfFree = ledger.locks.runNowIfFree.bind(ledger.locks);
    ledger.locks.runNowIfFree = (key, fn) => (runNowIfFree(key, fn) ? (immediate += 1, true) : false);
    let next = 0;
    for (let batch = 0; batch < 150; batch++) {
      const asked: Promise<unknown>[] = [];
      for (let n = 1 + Math.floor(random() * 6); n > 0; n--) {
        const key = pick(keys);
        const rows = expected.get(key)!;
        const dice = random();
        if (dice < 0.6) {
          const id = `mc-${next++}`;
          if (random() < 0.1) {
            failing.add(id);
            asked.push(expect(ledger.append(ledgerRow(key, id))).rejects.toThrow("no space left"));
          } else {
            rows.push(id);
            asked.push(ledger.append(ledgerRow(key, id)));
          }
        } else if (dice < 0.75 && rows.length > 0) {
          const id = pick(rows);
          rows.splice(rows.lastIndexOf(id), 1);
          asked.push(ledger.retract(key, id));
        } else if (dice < 0.85) {
          const id = `mc-${next++}`;
          rows.splice(0, rows.length, id);
          asked.push(ledger.replace(key, [ledgerRow(key, id)]));
        } else if (dice < 0.95) {
          rows.splice(0);
          asked.push(ledger.remove([key]));
        } else asked.push(ledger.rows(key));
      }
      await Promise.all(asked);
    }
    for (const key of keys) {
      expect({ key, rows: (await ledger.rows(key)).map((r) => r.model_call_id) }).toEqual({ key, rows: expected.get(key) });
      const text = await readFile(join(dir, "ledger", `${key}.lineage.jsonl`), "utf8").catch(() => "");
      expect({ key, file: text.split("\n").filter(Boolean).map((line) => JSON.parse(line).model_call_id) }).toEqual({ key, file: expected.get(key) });
    }
    expect(immediate).toBeGreaterThan(10); // the immediate path was taken, not only the locked one
  });

  it("a ledger closed right after an append (shutdown) still writes the row", async () => {
    const ledger = new CaptureLedger(join(dir, "ledger"), 4);
    const row = (id: string) => ledgerRow("shut", id);
    await ledger.append(row("mc-1"));
    const appending = ledger.append(row("mc-2"));
    const closing = ledger.close();
    await appending;
    await closing;
    const lines = (await readFile(join(dir, "ledger", "shut.lineage.jsonl"), "utf8")).split("\n").filter(Boolean);
    expect(lines.map((l) => JSON.parse(l).model_call_id)).toEqual(["mc-1", "mc-2"]);
    await expect(ledger.append(row("mc-3"))).rejects.toThrow(/closed/);
  });
});
