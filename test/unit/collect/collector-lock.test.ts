import { mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
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

describe("collector.pid", () => {
  it("holds this process's pid and host while held, and is gone after release (no temp file left)", async () => {
    const lock = await acquireCollectorLock(dir);
    expect(lock.tookOver).toBeUndefined();
    expect(await readFile(lockFile(), "utf8")).toBe(`${process.pid} ${hostname()}\n`);
    expect(await readdir(dir)).toEqual(["collector.pid"]);
    await lock.release();
    expect(await readdir(dir)).toEqual([]);
  });

  it("refuses while a live process holds it (checkpoint_conflict) and leaves its file alone", async () => {
    const held = `${process.ppid} ${hostname()}\n`;
    await writeFile(lockFile(), held);
    await expect(acquireCollectorLock(dir)).rejects.toMatchObject({ code: "checkpoint_conflict" });
    expect(await readdir(dir)).toEqual(["collector.pid"]);
    expect(await readFile(lockFile(), "utf8")).toBe(held);
  });

  it.each([
    ["another host", `${process.ppid} some-other-node-${hostname()}\n`, /left by host/],
    ["unreadable content", "", /unreadable/],
  ])("takes over a file left by %s", async (_what, content, why) => {
    await writeFile(lockFile(), content);
    const lock = await acquireCollectorLock(dir);
    expect(lock.tookOver).toMatch(why);
    expect(await readFile(lockFile(), "utf8")).toBe(`${process.pid} ${hostname()}\n`);
  });

  it("release leaves a file another collector took over meanwhile", async () => {
    const lock = await acquireCollectorLock(dir);
    await writeFile(lockFile(), `${process.ppid} ${hostname()}\n`);
    await lock.release();
    expect(await readdir(dir)).toEqual(["collector.pid"]);
  });
});
