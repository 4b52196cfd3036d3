import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { mkdir, mkdtemp, readFile, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { acquireCollectorLock } from "../../../coordinator/collect/collector-lock.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collector-lock-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const lockFile = () => join(dir, "collector.pid");
/** When `pid` started (/proc/<pid>/stat field 22) and this boot's id: what a lock line records. */
const stat = (pid: number) => readFileSync(`/proc/${pid}/stat`, "utf8");
const startOf = (pid: number) => stat(pid).slice(stat(pid).lastIndexOf(")") + 2).split(" ")[19]!;
const bootId = () => readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
const lineOf = (pid: number, start = startOf(pid), boot = bootId()) => `${pid} ${hostname()} ${start} ${boot}\n`;

describe("collector.pid", () => {
  it("holds this process's pid, host, start time and boot id while held, and is gone after release (no temp file left)", async () => {
    const lock = await acquireCollectorLock(dir);
    expect(lock.tookOver).toBeUndefined();
    expect(await readFile(lockFile(), "utf8")).toBe(lineOf(process.pid));
    expect(await readdir(dir)).toEqual(["collector.pid"]);
    await lock.release();
    expect(await readdir(dir)).toEqual([]);
  });

  it.each([
    ["an older file without a start time", () => `${process.ppid} ${hostname()}\n`],
    ["the process's own start time and boot id", () => lineOf(process.ppid)],
  ])("refuses while a live process holds it (%s): checkpoint_conflict, its file left alone", async (_what, line) => {
    const held = line();
    await writeFile(lockFile(), held);
    await expect(acquireCollectorLock(dir)).rejects.toMatchObject({ code: "checkpoint_conflict", message: expect.stringContaining(`(pid ${process.ppid})`) });
    expect(await readdir(dir)).toEqual(["collector.pid"]);
    expect(await readFile(lockFile(), "utf8")).toBe(held);
  });

  it.each([
    // The parent is alive: its pid now belongs to a process that started after the one that wrote the file.
    ["a live pid's other start time (the pid was reused)", () => lineOf(process.ppid, String(Number(startOf(process.ppid)) + 1)), /another process/],
    ["an earlier boot", () => lineOf(process.ppid, startOf(process.ppid), "00000000-0000-0000-0000-000000000000"), /before this host last booted/],
    ["a pid that no longer runs (an older file)", () => `${spawnSync(process.execPath, ["-e", ""]).pid} ${hostname()}\n`, /is not running/],
    ["another host", () => `${process.ppid} some-other-node-${hostname()}\n`, /left by host/],
    ["unreadable content", () => "", /unreadable/],
    ["a start time that is not one", () => `${process.ppid} ${hostname()} 12x ${bootId()}\n`, /unreadable/],
    ["a boot id that is not one", () => `${process.ppid} ${hostname()} ${startOf(process.ppid)} not-a-boot-id\n`, /unreadable/],
  ])("takes over a file left by %s", async (_what, content, why) => {
    await writeFile(lockFile(), content());
    const lock = await acquireCollectorLock(dir);
    expect(lock.tookOver).toMatch(why);
    expect(await readFile(lockFile(), "utf8")).toBe(lineOf(process.pid));
    expect(await readdir(dir)).toEqual(["collector.pid"]);
  });

  it("a second acquisition in this process is refused while the first holds it, and succeeds once released", async () => {
    const first = await acquireCollectorLock(dir);
    await expect(acquireCollectorLock(dir)).rejects.toMatchObject({ code: "checkpoint_conflict" });
    await first.release();
    const second = await acquireCollectorLock(dir);
    expect(second.tookOver).toBeUndefined();
    await second.release();
    expect(await readdir(dir)).toEqual([]);
  });

  it("a second acquisition in this process through another spelling of the root (a symbolic link) is refused too: the live lock is not taken over", async () => {
    const alias = `${dir}-alias`;
    await symlink(dir, alias);
    try {
      const first = await acquireCollectorLock(dir);
      await expect(acquireCollectorLock(alias)).rejects.toMatchObject({ code: "checkpoint_conflict" });
      await first.release();
      expect(await readdir(dir)).toEqual([]);
    } finally {
      await rm(alias, { force: true });
    }
  });

  it("release leaves a file another collector took over meanwhile", async () => {
    const lock = await acquireCollectorLock(dir);
    await writeFile(lockFile(), `${process.ppid} ${hostname()}\n`);
    await lock.release();
    expect(await readdir(dir)).toEqual(["collector.pid"]);
  });

  it("a collector that died while taking over blocks nobody: its take-over entry is removed, the stale file taken over", async () => {
    const dead = spawnSync(process.execPath, ["-e", ""]).pid!;
    await writeFile(lockFile(), `${dead} ${hostname()}\n`);
    // A collector that died while taking over: its entry still in the take-over directory.
    const takeover = join(dir, ".collector.pid.takeover");
    await mkdir(takeover);
    await writeFile(join(takeover, "0123456789ab"), `${dead} ${hostname()}\n`);
    const lock = await acquireCollectorLock(dir);
    expect(lock.tookOver).toMatch(/is not running/);
    expect(await readdir(dir)).toEqual(["collector.pid"]);
    await lock.release();
  });

  it("a collector killed before its take-over directory moved into place leaves nothing behind: the next take-over removes it, a live one's stays", async () => {
    const dead = spawnSync(process.execPath, ["-e", ""]).pid!;
    await writeFile(lockFile(), `${dead} ${hostname()}\n`);
    const abandoned = ".collector.pid.takeover.0123456789ab";
    await mkdir(join(dir, abandoned));
    await writeFile(join(dir, abandoned, "0123456789ab"), `${dead} ${hostname()}\n`);
    // Still being made by live processes: one with its line, one empty (its line not yet written).
    const live = ".collector.pid.takeover.ba9876543210";
    await mkdir(join(dir, live));
    await writeFile(join(dir, live, "ba9876543210"), lineOf(process.ppid));
    const justMade = ".collector.pid.takeover.aaaaaaaaaaaa";
    await mkdir(join(dir, justMade));
    const lock = await acquireCollectorLock(dir);
    expect(lock.tookOver).toMatch(/is not running/);
    expect((await readdir(dir)).sort()).toEqual([justMade, live, "collector.pid"].sort());
    await lock.release();
  });

  it("refuses while a live collector is taking over (its take-over entry names a live process), the stale file left to it", async () => {
    const dead = spawnSync(process.execPath, ["-e", ""]).pid!;
    await writeFile(lockFile(), `${dead} ${hostname()}\n`);
    const takeover = join(dir, ".collector.pid.takeover");
    await mkdir(takeover);
    await writeFile(join(takeover, "0123456789ab"), lineOf(process.ppid));
    await expect(acquireCollectorLock(dir)).rejects.toMatchObject({ code: "checkpoint_conflict" });
    expect((await readdir(dir)).sort()).toEqual([".collector.pid.takeover", "collector.pid"]);
    expect(await readFile(lockFile(), "utf8")).toBe(`${dead} ${hostname()}\n`);
    expect(await readdir(takeover)).toEqual(["0123456789ab"]);
  });
});
