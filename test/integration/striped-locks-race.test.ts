import { spawnSync } from "node:child_process";
import { mkdir, mkdtemp, readFile, readdir, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { BOOT_ID, racersFor, startTimeOf } from "../support/lock-racers.js";

/**
 * Model participants in separate processes take one ledger stripe at once, round after round, while
 * its lock file is a dead owner's: each round exactly one may hold it (two would append to the same
 * ledger files), and the file must name that one. The processes stay up between rounds and start
 * each round at one agreed instant (spinning until it), so the race is as tight as the machine's
 * cores allow.
 */
const RACERS = 6;
const ROUNDS = 40;
const LOCKS = fileURLToPath(new URL("../../participants/kinds/model/striped-locks.ts", import.meta.url));
const RACER = `import { StripedLocks } from ${JSON.stringify(LOCKS)};
let locks;
process.on("message", async (m) => {
  if (m.type === "go") {
    locks = new StripedLocks(m.dir, 1, 300, 60_000);
    while (Date.now() < m.at); // the agreed instant
    try {
      await locks.run("k", async () => undefined);
      process.send({ held: true });
    } catch (error) {
      process.send({ held: false, message: error.message });
    }
  } else if (m.type === "close") {
    await locks?.close();
    locks = undefined;
    process.send({ closed: true });
  } else process.disconnect();
});
process.send({ ready: true });`;

const racers = racersFor(RACER, RACERS);

describe("ledger stripe locks: processes breaking one dead owner's lock at once", () => {
  it(`${RACERS} racers, ${ROUNDS} rounds: exactly one holds the stripe each round, its own pid in the file, nothing left behind`, { timeout: 120_000 }, async () => {
    const dead = spawnSync(process.execPath, ["-e", ""]).pid!;
    const stale = [
      `${dead} 0123456789abcdef`, // an owner that no longer runs (no start time: judged by its pid)
      `${process.ppid} 0123456789abcdef ${Number(startTimeOf(process.ppid)) + 1} ${BOOT_ID}`, // a reused, live pid
      "", // left empty long ago by an older version's writer that died between create and write
    ];
    for (let round = 0; round < ROUNDS; round++) {
      const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-stripe-racers-"));
      try {
        const path = join(dir, "stripe-0000.lock");
        await mkdir(dir, { recursive: true });
        await writeFile(path, stale[round % stale.length]!);
        const past = new Date(Date.now() - 60_000);
        await utimes(path, past, past);
        const at = Date.now() + 50;
        for (const r of racers()) r.child.send({ type: "go", dir, at });
        const replies = await Promise.all(racers().map((r) => r.next()));
        const holders = racers().filter((_, i) => replies[i]!.held === true);
        expect({ round, holders: holders.length }).toEqual({ round, holders: 1 });
        expect(replies.filter((m) => m.held === false).map((m) => m.message)).toEqual(Array(RACERS - 1).fill("ledger lock stripe-0000.lock is held by another live process"));
        expect((await readFile(path, "utf8")).split(" ")[0]).toBe(String(holders[0]!.child.pid));
        for (const r of racers()) r.child.send({ type: "close" });
        expect(await Promise.all(racers().map((r) => r.next()))).toEqual(racers().map(() => ({ closed: true })));
        expect(await readdir(dir)).toEqual([]);
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    }
  });
});
