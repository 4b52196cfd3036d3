import { spawnSync } from "node:child_process";
import { mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { BOOT_ID, racersFor, startTimeOf } from "../support/lock-racers.js";

/**
 * Collectors in separate processes start at once against one stale collector.pid, round after
 * round: each round exactly one may hold the lock, and the file must name that one. The processes
 * stay up between rounds and start each round at one agreed instant (spinning until it), so the
 * race is as tight as the machine's cores allow.
 */
const RACERS = 6;
const ROUNDS = 40;
const LOCK = fileURLToPath(new URL("../../coordinator/collect/collector-lock.ts", import.meta.url));
const RACER = `import { acquireCollectorLock } from ${JSON.stringify(LOCK)};
let lock;
process.on("message", async (m) => {
  if (m.type === "go") {
    while (Date.now() < m.at); // the agreed instant
    try {
      lock = await acquireCollectorLock(m.dir);
      process.send({ held: true });
    } catch (error) {
      process.send({ held: false, code: error.code ?? String(error) });
    }
  } else if (m.type === "release") {
    await lock?.release();
    lock = undefined;
    process.send({ released: true });
  } else process.disconnect();
});
process.send({ ready: true });`;

const racers = racersFor(RACER, RACERS);

describe("collector.pid: collectors in separate processes taking over one stale file at once", () => {
  it(`${RACERS} racers, ${ROUNDS} rounds: exactly one holds it each round, its own pid in the file, nothing left aside`, { timeout: 120_000 }, async () => {
    const dead = spawnSync(process.execPath, ["-e", ""]).pid!;
    const stale = [
      `${dead} ${hostname()}\n`, // an older file whose process is gone
      `${process.ppid} ${hostname()} ${Number(startTimeOf(process.ppid)) + 1} ${BOOT_ID}\n`, // a reused, live pid
    ];
    for (let round = 0; round < ROUNDS; round++) {
      const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-lock-racers-"));
      try {
        const content = stale[round % stale.length]!;
        await writeFile(join(dir, "collector.pid"), content);
        const at = Date.now() + 50;
        for (const r of racers()) r.child.send({ type: "go", dir, at });
        const replies = await Promise.all(racers().map((r) => r.next()));
        const holders = racers().filter((_, i) => replies[i]!.held === true);
        expect({ round, holders: holders.length }).toEqual({ round, holders: 1 });
        expect(replies.filter((m) => m.held === false).map((m) => m.code)).toEqual(Array(RACERS - 1).fill("checkpoint_conflict"));
        expect((await readFile(join(dir, "collector.pid"), "utf8")).split(" ")[0]).toBe(String(holders[0]!.child.pid));
        expect(await readdir(dir)).toEqual(["collector.pid"]);
        holders[0]!.child.send({ type: "release" });
        expect(await holders[0]!.next()).toEqual({ released: true });
        expect(await readdir(dir)).toEqual([]);
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    }
  });
});
