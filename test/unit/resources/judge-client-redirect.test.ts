import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { JudgeClient } from "../../../participants/verifiers/index.js";

/**
 * A judge URL that answers a redirect (a proxy or load balancer in front of the judge, a moved
 * path) must not get the judge's API key sent on: fetch keeps `authorization` on a same-origin
 * redirect, and the redirect's target need not be the judge the key was meant for.
 */
let server: Server;
let url: string;
const arrivals: { path: string; headers: IncomingHttpHeaders }[] = [];

beforeAll(async () => {
  server = createServer((req, res) => {
    arrivals.push({ path: req.url ?? "", headers: req.headers });
    req.resume();
    if (req.url?.startsWith("/v1/")) res.writeHead(307, { location: "/elsewhere/v1/chat/completions" }).end();
    else res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ choices: [{ message: { content: "YES" } }] }));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
});
afterAll(() => new Promise((resolve) => server.close(resolve)));

describe("JudgeClient and redirects", () => {
  it("refuses a redirect instead of following it with its API key", async () => {
    const judge = new JudgeClient({ baseUrl: url, apiKey: "judge-secret" });
    await expect(judge.ask([{ role: "user", content: "same?" }])).rejects.toThrow(/redirect.*307/);
    expect(arrivals.map((a) => a.path)).toEqual(["/v1/chat/completions"]);
    expect(arrivals[0]!.headers.authorization).toBe("Bearer judge-secret");
  });
});
