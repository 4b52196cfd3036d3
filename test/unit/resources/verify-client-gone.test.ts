import { request } from "node:http";
import type { AddressInfo } from "node:net";
import { describe, expect, it } from "vitest";
import { createResourcesApp } from "../../../participants/kinds/resources/index.js";
import { CodeVerifier, CohortCompareVerifier, liveSandboxes, SANDBOX_SLOTS, stopSandboxes } from "../../../participants/verifiers/index.js";
import { waitUntil } from "../../support/wait-until.js";

const LIMITS = { memoryMb: 48, caseTimeoutMs: 500, startupMs: 4000, maxCaseOutputChars: 64 * 1024 };
// 40 looping cases of 500 ms: a run nobody stops holds its sandbox slot for 20 s.
const looping = { task: { function_name: "f", tests: Array.from({ length: 40 }, () => ({ args: [], expected: 1 })) }, answer: "function f() { for (;;) {} }" };

describe("a /verify whose client went away", () => {
  it("stops its sandbox child, so an abandoned call (a caller's timeout and retry) does not hold a slot for the whole run", async () => {
    const { app } = await createResourcesApp(new CodeVerifier(LIMITS));
    await app.listen({ port: 0, host: "127.0.0.1" });
    const { port } = app.server.address() as AddressInfo;
    const call = request({ host: "127.0.0.1", port, method: "POST", path: "/ng-rollout/r1/verify", headers: { "content-type": "application/json" } });
    call.on("error", () => undefined);
    try {
      call.end(JSON.stringify(looping));
      await waitUntil(() => liveSandboxes() === 1, "the sandbox child");
      call.destroy();
      await waitUntil(() => liveSandboxes() === 0, "the abandoned run's child to be stopped", 5000);
      expect(SANDBOX_SLOTS.active).toBe(0);
    } finally {
      call.destroy();
      stopSandboxes();
      await app.close();
    }
  });

  it("leaves its cohort slot (the member's retry takes it again), so a cohort every member left stops counting at once", async () => {
    const verifier = new CohortCompareVerifier({ size: 2 }, async (members) => members.map(() => 1));
    const { app } = await createResourcesApp(verifier);
    await app.listen({ port: 0, host: "127.0.0.1" });
    const { port } = app.server.address() as AddressInfo;
    const call = request({ host: "127.0.0.1", port, method: "POST", path: "/ng-rollout/m0/verify", headers: { "content-type": "application/json" } });
    call.on("error", () => undefined);
    try {
      call.end(JSON.stringify({ task: "t", answer: "a", _ng_group_id: "g1", _ng_rollout_index: 0 }));
      await waitUntil(() => verifier.table.activeCohorts === 1, "the member waiting in its cohort");
      call.destroy();
      await waitUntil(() => verifier.table.activeCohorts === 0, "the cohort its only member left to stop counting", 5000);
    } finally {
      call.destroy();
      await app.close();
    }
  });
});
