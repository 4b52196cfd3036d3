import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { beforeAll, describe, expect, it } from "vitest";
import { cli, ensureBuilt } from "./coordinator-process.js";

/**
 * `--help` of the programs the CLI hands its arguments to (their usage says "try --help"): the
 * usage on stdout and exit 0, before any flag is validated or NATS is dialled. No nats-server needed.
 */
beforeAll(() => ensureBuilt());

const run = promisify(execFile);

describe("--help of participant programs (built binary)", () => {
  it("gym-ckpt attach model --help lists the proxy's and the common flags", async () => {
    const help = await cli(["attach", "model", "--help"]);
    expect([help.code, help.stderr]).toEqual([0, ""]);
    expect(help.stdout).toMatch(/^usage: attach-model /);
    for (const flag of ["--upstream", "--cuts", "--ledger-dir", "--nats", "--token", "--checkpoint-root", "--lease-grace-seconds"]) {
      expect(help.stdout).toContain(flag);
    }
  });

  it("a reference Gym server's --help lists its own flags", async () => {
    const { stdout, stderr } = await run(process.execPath, ["dist/participants/gym/environment-server/main.js", "--help"], { timeout: 30_000 });
    expect(stderr).toBe("");
    expect(stdout).toMatch(/^usage: environment-server /);
    expect(stdout).toContain("--agent-url");
  });

  it("gym-ckpt seeds --help prints its usage", async () => {
    const help = await cli(["seeds", "--help"]);
    expect([help.code, help.stderr]).toEqual([0, ""]);
    expect(help.stdout).toMatch(/^usage: gym-ckpt seeds --checkpoint <dir> --out <tasks.jsonl>/);
  });
});
