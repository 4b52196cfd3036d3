import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, readdir, rm, unlink, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { StripedLocks } from "../../../participants/kinds/model/index.js";
import { waitUntil } from "../../support/wait-until.js";

let dir: string;
const open: StripedLocks[] = [];
let offset = 0;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-locks-wall-"));
  offset = 0;
  const wall = Date.now.bind(Date);
  // The wall clock as NTP or a VM resume would move it; the tests set `offset`.
  vi.spyOn(Date, "now").mockImplementation(() => wall() + offset);
});
afterEach(async () => {
  vi.restoreAllMocks();
  for (const l of open.splice(0)) await l.close();
  await rm(dir, { recursive: true, force: true });
});

/** Counts the tries of `l` to place a lock file (a private step of its wait). */
function countingTries(l: StripedLocks): () => number {
  let tries = 0;
  const internals = l as unknown as { place(path: string): Promise<boolean> };
  const place = internals.place.bind(l);
  internals.place = (path) => {
    tries++;
    return place(path);
  };
  return () => tries;
}

// Both are durations within this process (how long it waited, how long a stripe it owns sat idle):
// before, they were measured with Date.now(), so a wall-clock step cut the wait short or kept an idle
// stripe's lock file for an hour. (A lock file's age, by its mtime another process wrote, is judged
// by the directory's own clock: see the empty-file tests below.)
describe("striped locks under a wall-clock step", () => {
  it("a step ahead while waiting for a stripe another live process holds does not end the wait early", async () => {
    const l = new StripedLocks(join(dir, "locks"), 4, 10_000, 60_000);
    open.push(l);
    const tries = countingTries(l);
    await mkdir(join(dir, "locks"), { recursive: true });
    const file = l.lockFile(l.stripeOf("k"));
    await writeFile(file, String(process.ppid)); // a live owner
    let outcome: string | undefined;
    const run = l.run("k", async () => "ran").then((v) => (outcome = v), (e: Error) => (outcome = e.message));
    await waitUntil(() => tries() >= 2, "the wait under way", 5000);
    offset = 3_600_000;
    const stepped = tries();
    await waitUntil(() => tries() >= stepped + 3 || outcome !== undefined, "tries after the step", 5000);
    expect(outcome).toBeUndefined(); // still waiting: 10 s had not passed
    await unlink(file); // the owner let go
    await run;
    expect(outcome).toBe("ran");
  });

  it("a step back does not keep an idle stripe's lock file", async () => {
    const l = new StripedLocks(join(dir, "locks"), 4, 10_000, 30);
    open.push(l);
    const file = l.lockFile(l.stripeOf("k"));
    await l.run("k", async () => "ran");
    offset = -3_600_000; // stepped back right after its last use
    await waitUntil(() => !existsSync(file) && l.ownedStripes().length === 0, "the idle stripe released", 3000);
  });

  // An empty lock file (left by a writer that died between create and write) is broken once older
  // than a grace. Its mtime is the file system's clock (on NFS the server's), which this process's
  // clock need not agree with: its age was judged by Date.now(), so a host an hour ahead broke a
  // live writer's fresh file, and one an hour behind waited for a dead writer's for an hour.
  it("an empty lock file fresh by the directory's clock is not broken, though this process's clock is an hour ahead", async () => {
    const l = new StripedLocks(join(dir, "locks"), 4, 300, 60_000);
    open.push(l);
    await mkdir(join(dir, "locks"), { recursive: true });
    const file = l.lockFile(l.stripeOf("k"));
    await writeFile(file, ""); // mtime: now, by the file system
    offset = 3_600_000; // the mtime is an hour in the past to this process
    await expect(l.run("k", async () => "ran")).rejects.toThrow(/held by another live process/);
    expect(await readFile(file, "utf8")).toBe("");
    expect((await readdir(join(dir, "locks"))).filter((name) => name.startsWith(".clock-probe."))).toEqual([]);
  });

  it("an empty lock file old by the directory's clock is broken, though this process's clock is an hour behind", async () => {
    const l = new StripedLocks(join(dir, "locks"), 4, 2_000, 60_000);
    open.push(l);
    await mkdir(join(dir, "locks"), { recursive: true });
    const file = l.lockFile(l.stripeOf("k"));
    await writeFile(file, "");
    const old = new Date(Date.now() - 60_000);
    await utimes(file, old, old); // a minute old by the file system
    offset = -3_600_000; // the mtime is 59 minutes in the future to this process
    expect(await l.run("k", async () => "ran")).toBe("ran");
  });
});
