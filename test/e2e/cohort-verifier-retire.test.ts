/** Real processes: a nats-server and the cohort verifier spawned from dist/, driven over NATS. */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startChildProgram, type ChildProgram } from "../../coordinator/local/child-program.js";
import { controlRequest, phase } from "../support/control-requests.js";
import { startNats, type NatsFixture } from "../support/nats.js";

let nats: NatsFixture;
let root: string;
let prog: ChildProgram | undefined;
beforeAll(async () => {
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-cohort-"));
});
afterAll(async () => {
  await prog?.kill("SIGKILL");
  await nats.close();
  await rm(root, { recursive: true, force: true });
});

describe("cohort verifier retire, real process", () => {
  it("retiring a member waiting in its cohort ends its wait: the retire and the next checkpoint go through", async () => {
    prog = await startChildProgram(
      join(process.cwd(), "dist/participants/verifiers/main.js"),
      ["--verifier", "cohort", "--judge-url", "http://127.0.0.1:9", "--cohort-size", "2", "--collection-timeout-ms", "20000",
       "--nats", nats.server.url, "--deployment", "cohortretire", "--instance", "cohort", "--token", "tok", "--checkpoint-root", root],
      { waitReady: true, readyTimeoutMs: 20000 },
    );
    const url = String(prog.ready!.url);
    const ctl = (op: any, body: object) => controlRequest(nats.nc, { deployment: "cohortretire", kind: "resources", instance: "cohort", token: "tok" }, op, body);
    const seed = await fetch(url + "/ng-rollout/r1/seed_session", { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    const cookie = seed.headers.get("set-cookie")!.split(";")[0]!;
    const waiting = fetch(url + "/ng-rollout/r1/verify", {
      method: "POST",
      headers: { "content-type": "application/json", cookie },
      body: JSON.stringify({ task: {}, answer: "a", _ng_group_id: "g1", _ng_rollout_index: 0 }),
    });
    let cohorts = 0;
    for (let i = 0; i < 200 && cohorts === 0; i++) {
      cohorts = ((await (await fetch(url + "/health")).json()) as { active_cohorts: number }).active_cohorts;
      if (cohorts === 0) await new Promise((resolve) => setTimeout(resolve, 25));
    }
    expect(cohorts).toBe(1);
    // The waiting member is a replayable /verify: it holds up no prepare (docs/verifiers.md)...
    expect((await ctl("status", {})).report.ready).toBe(true);
    // ...nor its retire, which ends its wait instead of missing its deadline and leaving the
    // session `retiring` (a blocker of every prepare until the cohort timed out).
    expect(await ctl("retire", phase("x1", { episode_ids: [{ rollout_id: "r1", attempt: 0 }] }, 5))).toEqual({ retired: ["r1"] });
    const answered = await waiting;
    expect(answered.status).toBe(409);
    expect(((await answered.json()) as { error: { code: string } }).error.code).toBe("stale_attempt");
    const prepared = await ctl("prepare", phase("c1", {}, 5));
    await ctl("resume", phase("c1"));
    expect(prepared.phase).toBe("prepared");
  }, 60000);
});
