import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { HttpControllerClient } from "../../coordinator/client/http-controller-client.js";
import { HEADER_COORDINATOR_EPOCH, HEADER_COORDINATOR_ID, HEADER_COORDINATOR_SERVED } from "../../protocol/index.js";
import { waitUntil } from "../support/wait-until.js";
import { outcomeAcrossWallStepBack } from "../support/wall-clock-step.js";

// The HTTP controller client's failure mapping against real sockets: only a connection that was
// never made is not_leader (nothing was sent); a connection cut after the request left is
// outcome_unknown (the op may have run); a request fetch refuses to send is invalid_request.
let server: Server | undefined;
afterEach(async () => {
  server?.closeAllConnections();
  await new Promise((resolve) => (server ? server.close(resolve) : resolve(undefined)));
  server = undefined;
});

const listen = async (handler: Parameters<typeof createServer>[1]) => {
  server = createServer(handler);
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server!.address() as AddressInfo).port}`;
};

/** The API's `/readyz` refusal of a coordinator not (or no longer) the ready leader. */
const NOT_LEADER = JSON.stringify({ error: { code: "not_leader", detail: "not ready" } });

describe("HTTP controller client", () => {
  it("nobody listening: not_leader", async () => {
    const url = await listen(() => undefined);
    await new Promise((resolve) => server!.close(resolve)); // the port is free again
    server = undefined;
    await expect(new HttpControllerClient({ baseUrl: url, token: "t" }).call("status", {})).rejects.toMatchObject({ code: "not_leader" });
  });

  it("a coordinator still becoming leader (not_leader) is asked again within leaderWaitMs, and only then", async () => {
    let asked = 0;
    const url = await listen((req, res) => {
      // The client also asks /readyz beside an op (who leads as it is sent): not an op.
      if (req.url === "/readyz") return void res.writeHead(503, { "content-type": "application/json" }).end(JSON.stringify({ error: { code: "not_leader", detail: "not ready" } }));
      asked += 1;
      res.writeHead(asked <= 2 ? 503 : 200, { "content-type": "application/json" });
      res.end(JSON.stringify(asked <= 2 ? { error: { code: "not_leader", detail: "waits one lease period" } } : { checkpoints: [], latest: null }));
    });
    await expect(new HttpControllerClient({ baseUrl: url, token: "t" }).call("list", {})).rejects.toMatchObject({ code: "not_leader" });
    expect(asked).toBe(1); // no wait by default
    asked = 0;
    await expect(new HttpControllerClient({ baseUrl: url, token: "t", leaderWaitMs: 10_000 }).call("list", {})).resolves.toMatchObject({ checkpoints: [] });
    expect(asked).toBe(3);
  });

  // Before, the leader wait was a Date.now() instant: a wall clock stepped back kept the client
  // asking for the step's length (an hour) instead of leaderWaitMs.
  it("the leader wait is timed on the monotonic clock: a wall-clock step back does not stretch it", async () => {
    const url = await listen((_req, res) => {
      res.writeHead(503, { "content-type": "application/json" }).end(JSON.stringify({ error: { code: "not_leader", detail: "no leader yet" } }));
    });
    expect(await outcomeAcrossWallStepBack(() => new HttpControllerClient({ baseUrl: url, token: "t", leaderWaitMs: 500 }).call("list", {}))).toBe("not_leader");
  });

  it("the coordinator dies after receiving the request: outcome_unknown, not not_leader", async () => {
    let received = 0;
    const url = await listen((req) => {
      if (req.url !== "/readyz") received += 1; // the client also asks /readyz beside an op without a deadline
      req.socket.destroy(); // crashed mid-commit
    });
    const client = new HttpControllerClient({ baseUrl: url, token: "t" });
    await expect(client.call("commit", { checkpoint_id: "c1", episode_ids: null })).rejects.toMatchObject({ code: "outcome_unknown" });
    expect(received).toBe(1);
  });

  it("a proxy's gateway error without a catalog body (nginx's HTML 504 after its read timeout) is outcome_unknown, not internal_error: the op may still run", async () => {
    const ops: string[] = [];
    const url = await listen((req, res) => {
      if (req.url === "/readyz") return void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ ok: true, epoch: 1 }));
      ops.push(req.url!);
      const status = ops.length === 1 ? 504 : ops.length === 2 ? 502 : 503;
      res.writeHead(status, { "content-type": "text/html" });
      res.end(`<html><body><h1>${status} Gateway error</h1></body></html>`);
    });
    const client = new HttpControllerClient({ baseUrl: url, token: "t" });
    const deadline_ts = Date.now() / 1000 + 60;
    for (let i = 0; i < 3; i++) {
      await expect(client.call("commit", { checkpoint_id: "c1", episode_ids: null, deadline_ts })).rejects.toMatchObject({ code: "outcome_unknown" });
    }
    expect(ops).toEqual(["/v1/commit", "/v1/commit", "/v1/commit"]);
    // Any other answer that is not the API's stays internal_error (a wrong URL, say).
    server!.removeAllListeners("request");
    server!.on("request", (_req, res) => {
      res.writeHead(404, { "content-type": "text/html" });
      res.end("<html>not here</html>");
    });
    await expect(client.call("commit", { checkpoint_id: "c1", episode_ids: null, deadline_ts })).rejects.toMatchObject({ code: "internal_error" });
  });

  it("a base URL that cannot be used is invalid_request before anything is sent, never outcome_unknown", async () => {
    const refusal = async (baseUrl: string) => {
      try {
        await new HttpControllerClient({ baseUrl, token: "t" }).call("commit", { checkpoint_id: "c1", episode_ids: null });
      } catch (error) {
        return { baseUrl, code: (error as { code?: string }).code, detail: (error as Error).message };
      }
      return { baseUrl, code: "sent" };
    };
    for (const baseUrl of ["127.0.0.1:8480", "localhost:8480", "ftp://127.0.0.1:8480", "http://127.0.0.1:99999", "http://user:pw@127.0.0.1:8480", "http://127.0.0.1:1"]) {
      const result = await refusal(baseUrl);
      expect(result).toMatchObject({ baseUrl, code: "invalid_request" });
      expect(result.detail).not.toContain("pw");
    }
    // A token fetch cannot put in a header: refused before sending, and the detail does not quote it.
    const url = await listen(() => undefined);
    const bad = (await new HttpControllerClient({ baseUrl: url, token: "se\ncret" }).call("status", {}).then(
      () => new Error("sent"),
      (e: unknown) => e as Error,
    )) as Error & { code?: string };
    expect(bad).toMatchObject({ code: "invalid_request" });
    expect(bad.message).not.toContain("cret");
  });

  // A wait past 90 s (an op that takes a deadline, sent without one) and one bounded by a deadline:
  // the second went unwatched, and a frozen coordinator kept it waiting until deadline + slack.
  it.each([
    ["an op sent without a deadline", (client: HttpControllerClient) => client.checkpoint({ checkpoint_id: "h1", episode_ids: [] })],
    ["an op sent with a deadline 60 s ahead", (client: HttpControllerClient) => client.commit({ checkpoint_id: "h3", episode_ids: [], deadline_ts: Date.now() / 1000 + 60 })],
  ])("%s waits while the coordinator stays the ready leader, and ends outcome_unknown once its /readyz fails twice", async (_what, send) => {
    let ready = true;
    let received = 0;
    let checks = 0;
    const url = await listen((req, res) => {
      // Not ready: the API's own refusal (a proxy's 502/503 without it is a stop in progress, no failure).
      if (req.url === "/readyz") return void res.writeHead(ready ? 200 : 503, { "content-type": "application/json" }).end(ready ? "{}" : NOT_LEADER, () => (checks += 1));
      received += 1; // the op itself: never answered (a coordinator that froze or lost its lease mid-op)
    });
    // The check's period is also each /readyz fetch's timeout: 20 ms made two slow fetches on a
    // loaded machine count as "not ready" and end the op early (seen once in a full run).
    const client = new HttpControllerClient({ baseUrl: url, token: "t", readyCheckMs: 200 });
    let settled: unknown = "pending";
    void send(client).then(
      (reply) => (settled = reply),
      (error: unknown) => (settled = error),
    );
    await waitUntil(() => received === 1 && checks >= 5, "the op to reach the coordinator and five readiness checks to pass");
    expect(settled).toBe("pending");
    ready = false;
    await waitUntil(() => settled !== "pending", "the op to end once the coordinator is not ready", 10_000);
    expect(settled).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("stopped being the ready leader") });
  });

  it("an op sent without a deadline ends outcome_unknown once /readyz names another epoch (another coordinator leads behind the same address)", async () => {
    let epoch = 7;
    let checks = 0;
    const url = await listen((req, res) => {
      if (req.url === "/readyz") return void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ ok: true, epoch }), () => (checks += 1));
    });
    // The check's period is also each /readyz fetch's timeout: 20 ms made two slow fetches on a
    // loaded machine count as "not ready" and end the op early (seen once in a full run).
    const client = new HttpControllerClient({ baseUrl: url, token: "t", readyCheckMs: 200 });
    let settled: unknown = "pending";
    void client.checkpoint({ checkpoint_id: "h2", episode_ids: [] }).then(
      (reply) => (settled = reply),
      (error: unknown) => (settled = error),
    );
    await waitUntil(() => checks >= 5, "five readiness checks with the same epoch");
    expect(settled).toBe("pending");
    epoch = 9;
    await waitUntil(() => settled !== "pending", "the op to end once another coordinator leads", 10_000);
    expect(settled).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("changed leader (epoch 7, now 9)") });
  });

  // Behind a load balancer in front of several coordinators, a standby's /readyz refusal was counted
  // as the op's coordinator having stopped leading: two in a row ended an op the leader still ran.
  it("only the /readyz refusals of the coordinator that took the op end its wait, not a standby's behind the same address", async () => {
    let answering: "leader" | "standby" | "leader refuses" = "leader";
    let checks = 0;
    // The bodies are a coordinator's as ever (an older client reads them strictly); headers name who answered.
    const url = await listen((req, res) => {
      if (req.url !== "/readyz") return; // the op: never answered
      const ready = answering === "leader";
      const body = ready ? JSON.stringify({ ok: true, epoch: 3 }) : NOT_LEADER;
      const id = answering === "standby" ? "coord-b" : "coord-a";
      res.writeHead(ready ? 200 : 503, { "content-type": "application/json", [HEADER_COORDINATOR_ID]: id, ...(ready ? { [HEADER_COORDINATOR_EPOCH]: "3" } : {}) }).end(body, () => (checks += 1));
    });
    const client = new HttpControllerClient({ baseUrl: url, token: "t", readyCheckMs: 200 });
    let settled: unknown = "pending";
    void client.checkpoint({ checkpoint_id: "lb1", episode_ids: [] }).then(
      (reply) => (settled = reply),
      (error: unknown) => (settled = error),
    );
    await waitUntil(() => checks >= 2, "the leader to answer the check beside the op");
    answering = "standby";
    const before = checks;
    await waitUntil(() => checks >= before + 5, "five checks answered by the standby's refusal");
    expect(settled).toBe("pending");
    answering = "leader refuses";
    await waitUntil(() => settled !== "pending", "the op to end once its own coordinator refuses", 10_000);
    expect(settled).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("stopped being the ready leader (coordinator coord-a)") });
  });

  // Refusals of a standby (a coordinator holding no term: no epoch header) before any check named the
  // op's say nothing about it: the op's own deadline bounds the wait (a balancer keeping the client's
  // checks on a standby's connection while the leader runs the op).
  it("a standby's refusals while the op's coordinator is not known yet leave the op to its deadline", async () => {
    const url = await listen((req, res) => {
      if (req.url !== "/readyz") return; // the op: never answered
      res.writeHead(503, { "content-type": "application/json", [HEADER_COORDINATOR_ID]: "coord-b" }).end(NOT_LEADER);
    });
    const client = new HttpControllerClient({ baseUrl: url, token: "t", readyCheckMs: 100, slackMs: 500 });
    await expect(client.commit({ checkpoint_id: "lb2", episode_ids: [], deadline_ts: Date.now() / 1000 + 1.5 })).rejects.toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("no reply from /v1/commit") });
  });

  // While the op's coordinator was not known (the check beside the op reached a standby), every
  // refusal naming a coordinator was ignored: an op whose coordinator froze behind a balancer that
  // took it out waited out its deadline, through the standby's election (its refusals now naming the
  // term it holds) and past it (its first ready answer was taken for the op's coordinator). A refusal
  // naming a term (Gym-Coordinator-Epoch) is the lease holder's, not serving: a failure whoever took
  // the op, and that term, ready later, is not the one that took it.
  it.each([
    ["the new leader's first ready answer", ["standby", "holder", "ready"], "coordinator coord-b leads in epoch 9, a term that did not serve yet after the op was sent"],
    ["two refusals of a leader not ready", ["standby", "holder", "holder"], "stopped being the ready leader"],
  ])("refusals naming a term while the op's coordinator is not known yet end the op before its deadline: %s", async (_what, answers, why) => {
    let checks = 0;
    const url = await listen((req, res) => {
      if (req.url !== "/readyz") return; // the op: never answered (its coordinator froze)
      const answer = answers[Math.min(checks++, answers.length - 1)];
      if (answer === "ready") return void res.writeHead(200, { "content-type": "application/json", [HEADER_COORDINATOR_ID]: "coord-b", [HEADER_COORDINATOR_EPOCH]: "9" }).end(JSON.stringify({ ok: true, epoch: 9 }));
      res.writeHead(503, { "content-type": "application/json", [HEADER_COORDINATOR_ID]: "coord-b", ...(answer === "holder" ? { [HEADER_COORDINATOR_EPOCH]: "9" } : {}) }).end(NOT_LEADER);
    });
    const client = new HttpControllerClient({ baseUrl: url, token: "t", readyCheckMs: 200 });
    const startedAt = performance.now();
    await expect(client.commit({ checkpoint_id: "lb3", episode_ids: [], deadline_ts: Date.now() / 1000 + 30 })).rejects.toMatchObject({ code: "outcome_unknown", message: expect.stringContaining(why) });
    expect(performance.now() - startedAt).toBeLessThan(10_000);
  });

  // A /readyz cut by a reset as the coordinator's stop closes its connections and listener (a check
  // written on a kept-alive connection the stop closed, or one connecting as the listener closes)
  // counted as a failed check: with the stopping coordinator's 503 on the connection it still served,
  // two failures ended the op under way there outcome_unknown, although its answer was coming.
  it("a /readyz reset as the coordinator stops counts like a refused connection, not a failed check", async () => {
    let checks = 0;
    let resets = 0;
    const url = await listen((req, res) => {
      if (req.url !== "/readyz") return; // the op: under way, answered later
      checks += 1;
      if (checks === 1) return void res.writeHead(200, { "content-type": "application/json", [HEADER_COORDINATOR_ID]: "coord-a", [HEADER_COORDINATOR_EPOCH]: "3" }).end(JSON.stringify({ ok: true, epoch: 3 }));
      // The stop began: its 503 on a connection still served, then resets.
      if (checks === 2) return void res.writeHead(503, { "content-type": "application/json", [HEADER_COORDINATOR_ID]: "coord-a", [HEADER_COORDINATOR_EPOCH]: "3" }).end(NOT_LEADER);
      req.socket.resetAndDestroy();
      resets += 1;
    });
    const client = new HttpControllerClient({ baseUrl: url, token: "t", readyCheckMs: 200 });
    let settled: unknown = "pending";
    void client.commit({ checkpoint_id: "g2", episode_ids: [], deadline_ts: Date.now() / 1000 + 30 }).then(
      (reply) => (settled = reply),
      (error: unknown) => (settled = error),
    );
    await waitUntil(() => resets >= 6 || settled !== "pending", "six /readyz checks reset");
    expect(settled).toBe("pending");
  });

  // Once the op's coordinator was known, another coordinator's refusal was ignored even when it named
  // a higher term than the op's (a successor waiting out its first lease period): the op's term is
  // gone then, yet the op waited for that successor's first ready answer. A refusal naming no term
  // (a standby) or a lower one (a deposed predecessor not yet aware) still says nothing.
  it("a refusal naming a higher term than the op's ends it at once: its coordinator lost the lease", async () => {
    let answering: "leader" | "standby" | "predecessor" | "successor" = "leader";
    let checks = 0;
    const url = await listen((req, res) => {
      if (req.url !== "/readyz") return; // the op: never answered (its coordinator froze)
      checks += 1;
      if (answering === "leader") return void res.writeHead(200, { "content-type": "application/json", [HEADER_COORDINATOR_ID]: "coord-a", [HEADER_COORDINATOR_EPOCH]: "3" }).end(JSON.stringify({ ok: true, epoch: 3 }));
      const term = answering === "predecessor" ? { [HEADER_COORDINATOR_EPOCH]: "2" } : answering === "successor" ? { [HEADER_COORDINATOR_EPOCH]: "4" } : {};
      res.writeHead(503, { "content-type": "application/json", [HEADER_COORDINATOR_ID]: answering === "predecessor" ? "coord-c" : "coord-b", ...term }).end(NOT_LEADER);
    });
    const client = new HttpControllerClient({ baseUrl: url, token: "t", readyCheckMs: 200 });
    let settled: unknown = "pending";
    void client.commit({ checkpoint_id: "lb4", episode_ids: [], deadline_ts: Date.now() / 1000 + 30 }).then(
      (reply) => (settled = reply),
      (error: unknown) => (settled = error),
    );
    await waitUntil(() => checks >= 2, "the leader to answer the check beside the op");
    for (const other of ["standby", "predecessor"] as const) {
      answering = other;
      const before = checks;
      await waitUntil(() => checks >= before + 4, `four checks answered by the ${other}'s refusal`);
      expect(settled).toBe("pending");
    }
    answering = "successor";
    const before = checks;
    await waitUntil(() => settled !== "pending", "the op to end once a higher term holds the lease", 10_000);
    expect(checks).toBe(before + 1);
    expect(settled).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("changed leader (epoch 3, now 4)") });
  });

  // f0c9baef counted every refusal naming a term while the op's coordinator was not known yet as a
  // term not serving yet: a failure, and its first ready answer ended the op. A leader whose renewal
  // lapsed for a moment (503 with its term, then ready again in it) or one stopping gracefully (503
  // with its term on the connections it still serves, while it answers the ops under way before it
  // lets the lease go) ended the op it was answering. Such a term says it served (HEADER_COORDINATOR_SERVED):
  // its refusal says nothing about the op, as before f0c9baef, whether its coordinator took the op or not.
  it.each([
    // The answers beside the op and after it, then the ones repeated for ever after.
    ["a leader whose renewal lapsed, ready again in its term, while the op's coordinator is not known", ["standby", "served"], ["ready"]],
    ["a leader stopping behind a balancer, while the op's coordinator is not known", ["standby"], ["served", "standby"]],
    ["a leader stopping behind a balancer, the op's coordinator", ["ready"], ["served", "standby"]],
  ])("a refusal naming a term that served does not end the op: %s", async (_what, first, repeated) => {
    let checks = 0;
    const url = await listen((req, res) => {
      if (req.url !== "/readyz") return; // the op: under way, answered later
      const at = checks++;
      const answer = at < first.length ? first[at] : repeated[(at - first.length) % repeated.length];
      if (answer === "ready") return void res.writeHead(200, { "content-type": "application/json", [HEADER_COORDINATOR_ID]: "coord-a", [HEADER_COORDINATOR_EPOCH]: "3" }).end(JSON.stringify({ ok: true, epoch: 3 }));
      if (answer === "standby") return void res.writeHead(503, { "content-type": "application/json", [HEADER_COORDINATOR_ID]: "coord-b" }).end(NOT_LEADER);
      res.writeHead(503, { "content-type": "application/json", [HEADER_COORDINATOR_ID]: "coord-a", [HEADER_COORDINATOR_EPOCH]: "3", [HEADER_COORDINATOR_SERVED]: "1" }).end(NOT_LEADER);
    });
    const client = new HttpControllerClient({ baseUrl: url, token: "t", readyCheckMs: 200 });
    let settled: unknown = "pending";
    void client.commit({ checkpoint_id: "lb5", episode_ids: [], deadline_ts: Date.now() / 1000 + 30 }).then(
      (reply) => (settled = reply),
      (error: unknown) => (settled = error),
    );
    await waitUntil(() => checks >= 8 || settled !== "pending", "eight /readyz checks");
    expect(settled).toBe("pending");
  });

  // The epoch an op was compared against was the first /readyz answer during its wait, asked one
  // period after sending: a failover completed by then (a short lease_ms) gave the successor's
  // epoch, so the op sent to the frozen predecessor waited out its deadline plus slack.
  it("an op is compared against the epoch that led as it was sent, not the first answer a period later", async () => {
    let epoch = 7;
    let checks = 0;
    const url = await listen((req, res) => {
      if (req.url === "/readyz") return void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ ok: true, epoch }), () => (checks += 1));
      // The op is taken, then its coordinator freezes, and another leads behind the address well
      // within the first check period (a /readyz asked beside the op is answered in milliseconds).
      setTimeout(() => (epoch = 9), 300);
    });
    const client = new HttpControllerClient({ baseUrl: url, token: "t", readyCheckMs: 1_500, slackMs: 1_000 });
    let settled: unknown = "pending";
    void client.commit({ checkpoint_id: "e1", episode_ids: [], deadline_ts: Date.now() / 1000 + 30 }).then(
      (reply) => (settled = reply),
      (error: unknown) => (settled = error),
    );
    // Before, it ended only at its deadline plus slack (31 s).
    await waitUntil(() => settled !== "pending", "the op to end once another coordinator leads", 8_000);
    expect(settled).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("changed leader (epoch 7, now 9)") });
    expect(checks).toBeGreaterThanOrEqual(2);
  });

  // The readiness watch went on once the reply's headers were in: a long reply body (a commit's
  // episode lists over a slow link) still arriving when /readyz failed twice (the coordinator lost
  // its lease, or stopped, just after answering) was cut off, outcome_unknown for an op answered.
  it("a reply whose body is still arriving is read whole, whatever /readyz says meanwhile", async () => {
    let headersSent = false;
    const reply = JSON.stringify({ latest: null, checkpoints: [] });
    const url = await listen((req, res) => {
      if (req.url === "/readyz") {
        if (!headersSent) return void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ ok: true, epoch: 3 }));
        return void res.writeHead(503, { "content-type": "application/json" }).end(JSON.stringify({ error: { code: "not_leader", detail: "lost its lease" } }));
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.write(reply.slice(0, 5), () => (headersSent = true));
      // The rest 1.5 s later (a slow link), past the two failed checks 200 ms apart that ended the wait before.
      setTimeout(() => res.end(reply.slice(5)), 1_500);
    });
    const client = new HttpControllerClient({ baseUrl: url, token: "t", readyCheckMs: 200 });
    await expect(client.list()).resolves.toEqual({ latest: null, checkpoints: [] });
  });

  // A coordinator behind a proxy that routes it by path (https://gw/ckpt → the coordinator): the
  // client resolved its routes against the host's root (new URL("/v1/…", base)), so it asked
  // https://gw/v1/… (another service, or the proxy's 404: internal_error), and /readyz likewise.
  it.each(["/gw/ckpt", "/gw/ckpt/"])("keeps the base URL's path %s for the ops and /readyz, as the Python example does", async (prefix) => {
    const asked: string[] = [];
    const url = await listen((req, res) => {
      asked.push(req.url!);
      if (req.url === "/gw/ckpt/readyz") return void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ ok: true, epoch: 3 }));
      if (req.url === "/gw/ckpt/v1/checkpoints/c.1x") return void res.writeHead(404, { "content-type": "application/json" }).end(JSON.stringify({ error: { code: "not_found", detail: "no such checkpoint" } }));
      if (req.url !== "/gw/ckpt/v1/checkpoints") return void res.writeHead(404, { "content-type": "text/html" }).end("<html>not the coordinator</html>");
      // Answered after a few readiness checks.
      setTimeout(() => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ latest: null, checkpoints: [] })), 300);
    });
    const client = new HttpControllerClient({ baseUrl: `${url}${prefix}`, token: "t", readyCheckMs: 50 });
    await expect(client.list()).resolves.toEqual({ latest: null, checkpoints: [] });
    const readyz = asked.filter((path) => path.endsWith("/readyz"));
    expect(asked.filter((path) => !path.endsWith("/readyz"))).toEqual(["/gw/ckpt/v1/checkpoints"]);
    expect(readyz.length).toBeGreaterThan(0);
    expect(new Set(readyz)).toEqual(new Set(["/gw/ckpt/readyz"]));
    await expect(client.get("c.1x")).rejects.toMatchObject({ code: "not_found" });
  });

  // The /readyz asked while the op waited was not tied to the op: answered meanwhile, the op left
  // it open until its own timeout (readyCheckMs), holding a socket and a timer, and with them a CLI
  // process that had its answer (a coordinator behind a balancer whose /readyz hangs).
  it("a /readyz still unanswered when the op's reply comes is given up at once", async () => {
    let readyzClosedAt: number | undefined;
    let answeredAt: number | undefined;
    const url = await listen((req, res) => {
      if (req.url === "/readyz") return void req.socket.once("close", () => (readyzClosedAt = performance.now())); // never answered
      // The op: answered once its first readiness check is under way.
      setTimeout(() => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ latest: null, checkpoints: [] }), () => (answeredAt = performance.now())), 2_400);
    });
    const client = new HttpControllerClient({ baseUrl: url, token: "t", readyCheckMs: 2_000 });
    await expect(client.list()).resolves.toEqual({ latest: null, checkpoints: [] });
    await waitUntil(() => readyzClosedAt !== undefined, "the /readyz request to be given up", 3_000);
    expect(readyzClosedAt! - answeredAt!).toBeLessThan(800);
  });

  // A GET op's request travels in its path alone: fields the op does not take were dropped unseen
  // (`list` with `{ checkpoint_id }` listed everything), where the NATS client's coordinator, and
  // the HTTP API for a query string, refuse them invalid_request.
  it("refuses a GET op's request with fields the op does not take, invalid_request, nothing sent", async () => {
    let asked = 0;
    const url = await listen((_req, res) => {
      asked += 1;
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ latest: null, checkpoints: [] }));
    });
    const client = new HttpControllerClient({ baseUrl: url, token: "t" });
    for (const [op, request] of [["list", { checkpoint_id: "c1" }], ["status", { verbose: true }], ["get", { checkpoint_id: "c1", latest: true }]] as const) {
      await expect(client.call(op, request as never)).rejects.toMatchObject({ code: "invalid_request" });
    }
    expect(asked).toBe(0);
    await expect(client.call("list", {})).resolves.toEqual({ latest: null, checkpoints: [] });
  });

  // A proxy in front that redirects (an ingress sending http:// to https:// with a 301, say): fetch
  // followed it, turning a POST into a GET without its body (301, 302, 303) and dropping the token
  // on a cross-origin hop, so the op came back as the target's refusal of another request: a commit
  // refused `not_found` ("no route GET /v1/commit", read as an unknown id) or `unauthorized`.
  it.each([301, 302, 307, 308])("a redirect (%i) is not followed: invalid_request naming where it points, nothing sent there", async (status) => {
    const followed: string[] = [];
    const target = createServer((req, res) => {
      followed.push(`${req.method} ${req.url} auth=${req.headers.authorization ?? "none"}`);
      res.writeHead(404, { "content-type": "application/json" }).end(JSON.stringify({ error: { code: "not_found", detail: `no route ${req.method} ${req.url}` } }));
    });
    await new Promise<void>((resolve) => target.listen(0, "127.0.0.1", resolve));
    try {
      const elsewhere = `http://127.0.0.1:${(target.address() as AddressInfo).port}`;
      const url = await listen((req, res) => void res.writeHead(status, { location: `${elsewhere}${req.url}` }).end());
      const client = new HttpControllerClient({ baseUrl: url, token: "t" });
      const refusal = await client.commit({ checkpoint_id: "c1", episode_ids: null, deadline_ts: Date.now() / 1000 + 30 }).then(
        () => new Error("answered"),
        (error: unknown) => error as Error,
      );
      expect(refusal).toMatchObject({ code: "invalid_request", message: expect.stringContaining(`${elsewhere}/v1/commit`) });
      expect(followed).toEqual([]);
    } finally {
      target.closeAllConnections();
      await new Promise((resolve) => target.close(resolve));
    }
  });
});
