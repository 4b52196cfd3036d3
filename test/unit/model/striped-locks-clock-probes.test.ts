import { mkdir, mkdtemp, readdir, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it, vi } from "vitest";

// Every reading of the lock directory's clock, counted: each is a probe file created and removed there.
const probes = vi.hoisted(() => ({ count: 0 }));
vi.mock("../../../participants/storage/filesystem-clock.js", async (actual) => {
  const real = await actual<typeof import("../../../participants/storage/filesystem-clock.js")>();
  return {
    ...real,
    filesystemClock: (dir: string) => {
      probes.count++;
      return real.filesystemClock(dir);
    },
  };
});
const { StripedLocks } = await import("../../../participants/kinds/model/index.js");

let dir: string;
const open: InstanceType<typeof StripedLocks>[] = [];
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-locks-probes-"));
  probes.count = 0;
});
afterEach(async () => {
  for (const l of open.splice(0)) await l.close();
  await rm(dir, { recursive: true, force: true });
});

// An empty lock file's age is judged by the directory's clock, read off a probe file made there. The
// wait for a stripe looks at its lock file every few milliseconds: it made a probe (create, stat,
// close, unlink: on NFS four round trips and a directory change) at every look, about a hundred in
// the empty file's 2 s grace. One reading, advanced by this process's monotonic clock, serves the wait.
it("a wait on an empty lock file reads the directory's clock once, not at every look", async () => {
  const l = new StripedLocks(join(dir, "locks"), 4, 400, 60_000);
  open.push(l);
  await mkdir(join(dir, "locks"), { recursive: true });
  const file = l.lockFile(l.stripeOf("k"));
  await writeFile(file, ""); // fresh: not stale within the wait
  await expect(l.run("k", async () => "ran")).rejects.toThrow(/held by another live process/);
  expect(probes.count).toBeLessThanOrEqual(2); // the wait's, and the owner file's sweep's at most
  expect((await readdir(join(dir, "locks"))).filter((name) => name.startsWith(".clock-probe."))).toEqual([]);
});

it("an empty lock file that grows old during the wait is broken, its age advancing on the one reading", async () => {
  const l = new StripedLocks(join(dir, "locks"), 4, 5_000, 60_000);
  open.push(l);
  await mkdir(join(dir, "locks"), { recursive: true });
  const file = l.lockFile(l.stripeOf("k"));
  await writeFile(file, "");
  const almost = new Date(Date.now() - 1_700); // 0.3 s short of the 2 s grace, by the file system
  await utimes(file, almost, almost);
  expect(await l.run("k", async () => "ran")).toBe("ran");
  expect(probes.count).toBeLessThanOrEqual(3);
});
