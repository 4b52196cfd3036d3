import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { ensureBuilt } from "./coordinator-process.js";

/**
 * A token with a space passed unquoted (`--token $T`) splits into `--token <first word>` and stray
 * words. A reference server must refuse that as a configuration error (exit 2, which a supervisor
 * does not restart) in one line that quotes none of it, as it refuses a token with whitespace
 * (docs/gym.md), not die with a stack trace quoting the rest of the secret (exit 1).
 */
const PROGRAMS = ["dist/participants/gym/environment-server/main.js", "dist/participants/attach/main.js", "dist/participants/verifiers/main.js"];

describe("a reference server given a stray positional argument", () => {
  it.each(PROGRAMS)("%s: exit 2 without quoting the argument", (program) => {
    ensureBuilt();
    const secret = "correct horse-SECRETWORD battery";
    const run = spawnSync(process.execPath, [program, "--nats", "nats://127.0.0.1:1", ...`--token ${secret}`.split(" ")], { encoding: "utf8", timeout: 20_000 });
    expect({ status: run.status, leaks: `${run.stdout}${run.stderr}`.includes("SECRETWORD") }, run.stderr).toEqual({ status: 2, leaks: false });
    expect(run.stderr).toMatch(/^[a-z-]+: invalid configuration: unexpected argument/);
  });

  it("an unknown option is named, its value never", () => {
    ensureBuilt();
    const run = spawnSync(process.execPath, [PROGRAMS[0]!, "--tokn=SECRETWORD"], { encoding: "utf8", timeout: 20_000 });
    expect({ status: run.status, stderr: run.stderr.trim() }).toEqual({ status: 2, stderr: "environment-server: invalid configuration: unknown option --tokn (see --help)" });
  });
});
