import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
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
    const run = spawnSync(process.execPath, [program, "--nats", "nats://127.0.0.1:1", ...`--token ${secret}`.split(" ")], { encoding: "utf8", timeout: 20_000, killSignal: "SIGKILL" });
    expect({ status: run.status, leaks: `${run.stdout}${run.stderr}`.includes("SECRETWORD") }, run.stderr).toEqual({ status: 2, leaks: false });
    expect(run.stderr).toMatch(/^[a-z-]+: invalid configuration: unexpected argument/);
  });

  it("an unknown option is named, its value never", () => {
    ensureBuilt();
    const run = spawnSync(process.execPath, [PROGRAMS[0]!, "--tokn=SECRETWORD"], { encoding: "utf8", timeout: 20_000, killSignal: "SIGKILL" });
    expect({ status: run.status, stderr: run.stderr.trim() }).toEqual({ status: 2, stderr: "environment-server: invalid configuration: unknown option --tokn (see --help)" });
  });
});

describe("configuration refused before anything starts", () => {
  const GYM = "dist/participants/gym/main.js";
  const run = (program: string, args: string[], env: Record<string, string> = {}) =>
    spawnSync(process.execPath, [program, ...args], { encoding: "utf8", timeout: 20_000, killSignal: "SIGKILL", env: { ...process.env, ...env } });

  it("gym-ckpt gym: an unknown option or a stray argument is one line and exit 2, not a stack trace", () => {
    ensureBuilt();
    const unknown = run(GYM, ["--tokn=SECRETWORD"]);
    expect({ status: unknown.status, stderr: unknown.stderr.trim() }).toEqual({ status: 2, stderr: "gym: invalid configuration: unknown option --tokn (see --help)" });
    const stray = run(GYM, "--token correct horse-SECRETWORD battery".split(" "));
    expect({ status: stray.status, leaks: `${stray.stdout}${stray.stderr}`.includes("SECRETWORD") }).toEqual({ status: 2, leaks: false });
  });

  it("gym-ckpt gym: a negative number after its flag says how to write a value beginning with a dash, instead of only 'needs a value'", () => {
    ensureBuilt();
    const dashed = run(GYM, ["--nats", "nats://127.0.0.1:1", "--token", "t0ken", "--token-delay-ms", "-1"]);
    expect({ status: dashed.status, stderr: dashed.stderr.trim() }).toEqual({
      status: 2,
      stderr: 'gym: invalid configuration: option --token-delay-ms needs a value; one beginning with "-" is written --token-delay-ms=<value>',
    });
    // Written so, the value reaches the flag's own check.
    const written = run(GYM, ["--nats", "nats://127.0.0.1:1", "--token", "t0ken", "--token-delay-ms=-1"]);
    expect({ status: written.status, stderr: written.stderr.trim() }).toEqual({ status: 2, stderr: expect.stringMatching(/^gym: invalid configuration: --token-delay-ms [^\n]*$/) });
  });

  it("gym-ckpt gym: a bad --lease-grace-seconds is named before any server starts (no server exits over it)", () => {
    ensureBuilt();
    const bad = run(GYM, ["--nats", "nats://127.0.0.1:1", "--token", "t0ken", "--lease-grace-seconds", "soon"]);
    expect(bad.status).toBe(2);
    expect(bad.stderr.trim()).toMatch(/^gym: invalid configuration: leaseGraceSeconds: /);
  });

  it.each([
    ["--resources-mode", "bogus"],
    ["--verify", "nope"],
    ["--token-delay-ms", "soon"],
    ["--policy-url", "not a url"],
    // What the model proxy refuses as its --upstream (exit 2 only once resources had started beside it).
    ["--policy-url", "http://user:SECRETWORD@127.0.0.1:9/v1"],
    ["--policy-url", "http://127.0.0.1:9/v1?api-key=SECRETWORD"],
  ])("gym-ckpt gym: a bad %s is one line and exit 2 before any server starts (not a server's exit 1 and its output)", (flag, value) => {
    ensureBuilt();
    // No NATS behind the URL: a server started anyway would fail on it (exit 1) instead.
    const bad = run(GYM, ["--nats", "nats://127.0.0.1:1", "--token", "t0ken", flag, value]);
    expect({ status: bad.status, stderr: bad.stderr.trim() }).toEqual({ status: 2, stderr: expect.stringMatching(new RegExp(`^gym: invalid configuration: ${flag} [^\n]*$`)) });
  });

  it("gym-ckpt gym: a bad GYM_CKPT_NATS_CONNECT_WAIT_MS is one line and exit 2 before any server starts (not the first server's exit and output)", () => {
    ensureBuilt();
    const bad = run(GYM, ["--nats", "nats://127.0.0.1:1", "--token", "t0ken"], { GYM_CKPT_NATS_CONNECT_WAIT_MS: "10s" });
    expect({ status: bad.status, stderr: bad.stderr.trim() }).toEqual({ status: 2, stderr: expect.stringMatching(/^gym: invalid configuration: natsConnectWaitMs: [^\n]*$/) });
  });

  it.each([
    ["a reference server", "dist/participants/gym/environment-server/main.js"],
    ["gym-ckpt gym", "dist/participants/gym/main.js"],
  ])("%s: empty GYM_CKPT_* variables count as unset, as for the coordinator (only the bad flag is refused)", (_what, program) => {
    ensureBuilt();
    const env = { GYM_CKPT_NATS_URL: "", GYM_CKPT_DEPLOYMENT: "", GYM_CKPT_CHECKPOINT_ROOT: "" };
    const bad = run(program, ["--token", "t0ken", "--lease-grace-seconds", "soon"], env);
    expect(bad.status).toBe(2);
    expect(bad.stderr.trim()).toMatch(/^[a-z-]+: invalid configuration: leaseGraceSeconds: [^\n;]*$/);
  });
});

describe("resources server given a bad --mode or --verify", () => {
  let nats: NatsFixture;
  beforeAll(async () => {
    nats = await startNats();
  });
  afterAll(async () => {
    await nats?.close();
  });

  it.each([
    ["--mode", "bogus", "resources-server: --mode must be one of restart_only, stateless, exported"],
    ["--verify", "nope", "resources-server: --verify must be one of wait, replay"],
  ])("%s %s: one line naming the flag and exit 2, not a zod issue list", (flag, value, line) => {
    ensureBuilt();
    const bad = spawnSync(process.execPath, ["dist/participants/gym/resources-server/main.js", "--nats", nats.server.url, "--token", "t0ken", flag, value], { encoding: "utf8", timeout: 20_000, killSignal: "SIGKILL" });
    expect({ status: bad.status, stderr: bad.stderr.trim() }).toEqual({ status: 2, stderr: line });
  });
});

describe("a reference server's own flags are checked before NATS", () => {
  // No NATS behind the URL: a flag checked only after connecting was answered `unreachable`, exit 1,
  // which a supervisor restarts for ever, instead of the configuration error (exit 2) it is.
  const DOWN = ["--nats", "nats://127.0.0.1:1", "--token", "t0ken"];
  it.each([
    ["resources-server", ["--mode", "bogus"], "resources-server: --mode must be one of restart_only, stateless, exported"],
    ["resources-server", ["--server", "counter", "--verify", "replay"], "resources-server: the counter server's /verify is declared wait (it ends the counter it reads)"],
    ["resources-server", ["--owner", ""], "resources-server: owner (the routing id written into records) must be 1-200 characters"],
    ["resources-server", ["--replayable-end-hold-ms", "1e3"], "resources-server: invalid configuration: --replayable-end-hold-ms must be a decimal number of milliseconds from 0 to 2147483647"],
    ["agent-server", ["--resources-url", "http://127.0.0.1:9"], "agent-server: --policy-url and --resources-url are required"],
    ["environment-server", ["--agent-url", "http://127.0.0.1:9"], "environment-server: --agent-url and --resources-url are required"],
    // Without a scheme every call failed at run time (fetch cannot parse it), never at start-up.
    ["environment-server", ["--agent-url", "127.0.0.1:9", "--resources-url", "http://127.0.0.1:9"], "environment-server: --agent-url must be an http or https URL"],
    ["agent-server", ["--policy-url", "http://127.0.0.1:9", "--resources-url", "localhost:9"], "agent-server: --resources-url must be an http or https URL"],
    // fetch refuses a URL with credentials and quotes it, password included, in every call's refusal.
    ["agent-server", ["--policy-url", "http://user:SECRETWORD@127.0.0.1:9", "--resources-url", "http://127.0.0.1:9"], "agent-server: --policy-url may not carry credentials (user:password@)"],
    ["environment-server", ["--agent-url", "http://127.0.0.1:9", "--resources-url", "http://SECRETWORD@127.0.0.1:9"], "environment-server: --resources-url may not carry credentials (user:password@)"],
    // Anything but "false" streamed: `--stream no` or `--stream 0` silently did the opposite.
    ["agent-server", ["--policy-url", "http://127.0.0.1:9", "--resources-url", "http://127.0.0.1:9", "--stream", "no"], "agent-server: --stream must be true or false"],
    ["policy-backend", ["--token-delay-ms", "70000"], "policy-backend: --token-delay-ms must be a number between 0 and 60000"],
  ])("%s %j: one line, exit 2", (server, args, line) => {
    ensureBuilt();
    const bad = spawnSync(process.execPath, [`dist/participants/gym/${server}/main.js`, ...DOWN, ...args], { encoding: "utf8", timeout: 20_000, killSignal: "SIGKILL" });
    expect({ status: bad.status, stderr: bad.stderr.trim() }).toEqual({ status: 2, stderr: line });
  });

  it("the environment server's --replay-config (missing, invalid, another source's): one invalid_request line, exit 2", () => {
    ensureBuilt();
    const dir = mkdtempSync(join(tmpdir(), "gym-ckpt-replay-flag-"));
    try {
      const urls = ["--agent-url", "http://127.0.0.1:9", "--resources-url", "http://127.0.0.1:9"];
      const configs = [
        [join(dir, "absent.json"), null, /^environment-server: invalid_request: replay config \S*absent\.json is not readable: ENOENT[^\n]*$/],
        // Not JSON.parse's message, which quotes the text: a newline there made the line two.
        [join(dir, "nope.json"), "nope\n", /^environment-server: invalid_request: replay config \S*nope\.json is not valid JSON$/],
        [join(dir, "recheck.json"), { records: "r/*.jsonl", source: { id: "reference-gym" }, mode: "recheck", anchor: "tool-call" }, /^environment-server: invalid_request: invalid replay config: anchor: anchor applies to mode=continue only$/],
        [join(dir, "other.json"), { records: "r/*.jsonl", source: { id: "gsm8k" } }, /^environment-server: invalid_request: config names source gsm8k but environment reference-gym was given$/],
      ] as const;
      for (const [file, config, line] of configs) {
        if (config) writeFileSync(file, typeof config === "string" ? config : JSON.stringify(config));
        const bad = spawnSync(process.execPath, ["dist/participants/gym/environment-server/main.js", ...DOWN, ...urls, "--replay-config", file], { encoding: "utf8", timeout: 20_000, killSignal: "SIGKILL" });
        expect({ status: bad.status, stderr: bad.stderr.trim() }).toEqual({ status: 2, stderr: expect.stringMatching(line) });
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it.each([
    [[], "attach model: --upstream <openai-base-url> is required"],
    [["--upstream", "http://127.0.0.1:9/v1", "--cuts", "maybe"], "attach model: --cuts must be on or off"],
    [["--upstream", "http://127.0.0.1:9/v1", "--cut-timeout-ms", "0"], "attach model: --cut-timeout-ms must be an integer in 1..600000"],
  ])("the attach proxy (the Gym's model process) %j: one line, exit 2", (args, line) => {
    ensureBuilt();
    const bad = spawnSync(process.execPath, ["dist/participants/attach/main.js", ...DOWN, ...args], { encoding: "utf8", timeout: 20_000, killSignal: "SIGKILL" });
    expect({ status: bad.status, stderr: bad.stderr.trim() }).toEqual({ status: 2, stderr: line });
  });

  it.each([
    [["--verifier", "bogus"], "verifier: unknown --verifier bogus (math, code, competitive, equivalence, cohort)"],
    [["--verifier", "equivalence"], "verifier: --judge-url is required for judge-based verifiers"],
    [["--verifier", "cohort", "--judge-url", "127.0.0.1:9"], "verifier: --judge-url must be an http or https URL"],
    [["--verifier", "cohort", "--judge-url", "http://127.0.0.1:9", "--cohort-size", "0"], "verifier: --cohort-size must be an integer ≥ 1"],
    [["--verifier", "code", "--max-sandbox-queue=-1"], "verifier: --max-sandbox-queue must be an integer ≥ 0"],
    // fetch refuses a URL with credentials and quotes it: every judge_failed detail carried the password.
    [["--verifier", "equivalence", "--judge-url", "http://judge:SECRETWORD@127.0.0.1:9"], "verifier: --judge-url may not carry credentials (user:password@): a judge's API key goes in GYM_CKPT_JUDGE_API_KEY"],
  ])("a verifier %j: one line, exit 2", (args, line) => {
    ensureBuilt();
    const bad = spawnSync(process.execPath, ["dist/participants/verifiers/main.js", ...DOWN, ...args], { encoding: "utf8", timeout: 20_000, killSignal: "SIGKILL" });
    expect({ status: bad.status, stderr: bad.stderr.trim() }).toEqual({ status: 2, stderr: line });
  });

  // fetch refuses such an Authorization value and quotes it: every judge_failed detail carried the key.
  it("a verifier whose GYM_CKPT_JUDGE_API_KEY holds a line break: one line naming the variable, not the key, exit 2", () => {
    ensureBuilt();
    const args = ["--verifier", "equivalence", "--judge-url", "http://127.0.0.1:9"];
    const bad = spawnSync(process.execPath, ["dist/participants/verifiers/main.js", ...DOWN, ...args], { encoding: "utf8", timeout: 20_000, killSignal: "SIGKILL", env: { ...process.env, GYM_CKPT_JUDGE_API_KEY: "SECRETKEY\nx" } });
    expect({ status: bad.status, stderr: bad.stderr.trim() }).toEqual({ status: 2, stderr: expect.stringMatching(/^verifier: the judge API key \(apiKey, GYM_CKPT_JUDGE_API_KEY\): /) });
    expect(bad.stderr).not.toContain("SECRETKEY");
  });
});
