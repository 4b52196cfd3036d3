import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { startChildProgram } from "../../../coordinator/local/child-program.js";
import { ProcessGroup } from "../../../coordinator/local/process-group.js";
import { waitUntil } from "../../support/wait-until.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-child-group-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe("a child program started in its own group", () => {
  it("kill reaches the rest of its group after the program itself exited (a process it started outlives it)", async () => {
    // The program starts a long-lived node process in its group, writes its pid and exits.
    const script = join(dir, "leader.mjs");
    await writeFile(
      script,
      `import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
const left = spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)"], { stdio: "ignore" });
writeFileSync(${JSON.stringify(join(dir, "left.pid"))}, String(left.pid));
process.exit(0);
`,
    );
    const program = await startChildProgram(script, [], { group: true });
    await program.exited;
    const left = Number(await readFile(join(dir, "left.pid"), "utf8"));
    try {
      expect(alive(left)).toBe(true);
      await program.kill();
      await waitUntil(() => !alive(left), "the group's remaining process to be gone", 5_000);
    } finally {
      if (alive(left)) process.kill(left, "SIGKILL");
    }
  });
});

describe("ProcessGroup", () => {
  const detachedSleeper = () => spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)"], { stdio: "ignore", detached: true });

  it("signals its group while the id is still its leader's", async () => {
    const leader = detachedSleeper();
    const group = new ProcessGroup(leader.pid!);
    const exited = new Promise((resolve) => leader.once("exit", resolve));
    expect(group.signal("SIGKILL")).toBe(true);
    await exited;
    expect(group.signal("SIGKILL")).toBe(false); // the group is gone: ESRCH, no throw
  });

  it("leaves alone a group whose id now names a later process (the number was reused)", async () => {
    const other = detachedSleeper();
    try {
      // As if ours had started at tick 1 and ended: the same id now leads an unrelated group.
      const stale = new ProcessGroup(other.pid!, "1");
      expect(stale.signal("SIGKILL")).toBe(false);
      expect(alive(other.pid!)).toBe(true);
    } finally {
      other.kill("SIGKILL");
    }
  });
});
