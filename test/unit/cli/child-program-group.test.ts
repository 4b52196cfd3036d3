import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { startChildProgram } from "../../../coordinator/local/child-program.js";
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
