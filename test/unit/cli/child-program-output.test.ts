import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { startChildProgram } from "../../../coordinator/local/child-program.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-child-output-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("a child program's exit", () => {
  it("resolves `exited` only once its output was read (a line still in the pipe when the exit is seen)", async () => {
    // The program exits at once; a process it started, sharing its stdout, prints one line later:
    // a line that reaches the pipe after the exit event, as a loaded machine can make the last ones.
    const script = join(dir, "early-exit.mjs");
    await writeFile(
      script,
      `import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
const late = spawn(process.execPath, ["-e", "setTimeout(() => console.log('error boom: the last line'), 200)"], { stdio: ["ignore", "inherit", "inherit"] });
writeFileSync(${JSON.stringify(join(dir, "late.pid"))}, String(late.pid));
process.exit(1);
`,
    );
    const lines: string[] = [];
    const program = await startChildProgram(script, [], { onLine: (line) => void lines.push(line) });
    try {
      expect(await program.exited).toEqual({ code: 1, signal: null });
      expect(lines).toEqual(["error boom: the last line"]);
    } finally {
      const late = Number(await readFile(join(dir, "late.pid"), "utf8").catch(() => "0"));
      try {
        if (late) process.kill(late, "SIGKILL");
      } catch {
        // already gone
      }
    }
  });
});
