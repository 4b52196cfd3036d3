import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { postJson } from "../../../participants/gym/agent-server/gym-http.js";
import { CheckpointError } from "../../../protocol/index.js";

/**
 * A data-plane call whose connection fails (refused, or cut before the reply was complete) is the
 * callee's failure, `upstream_failed` (502) with the path it called, not a bug of the caller's
 * (`internal_error`): the model proxy cuts a call whose capture-ledger row it could not write, and
 * the agent sends such a call again. A call the caller itself aborted stays its own abort.
 */
let server: Server | undefined;

afterEach(async () => {
  await new Promise((resolve) => (server ? server.close(resolve) : resolve(undefined)));
  server = undefined;
});

async function serve(handler: Parameters<typeof createServer>[1]): Promise<string> {
  server = createServer(handler);
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function failure(call: Promise<unknown>): Promise<unknown> {
  return call.then(
    () => new Error("the call succeeded"),
    (error: unknown) => error,
  );
}

describe("reference Gym data-plane calls whose connection fails", () => {
  it("a reply cut off mid-body is upstream_failed naming the path", async () => {
    const url = await serve((_req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.write('{"choices":');
      setImmediate(() => res.destroy());
    });
    const error = await failure(postJson(`${url}/ng-rollout/r1.a0/v1/chat/completions`, {}));
    expect(error).toBeInstanceOf(CheckpointError);
    expect(error).toMatchObject({ code: "upstream_failed", message: expect.stringContaining("/ng-rollout/r1.a0/v1/chat/completions") });
  });

  it("a connection closed before any reply is upstream_failed", async () => {
    const url = await serve((req) => req.socket.destroy());
    expect(await failure(postJson(`${url}/x`, {}))).toMatchObject({ code: "upstream_failed" });
  });

  // fetch refuses these itself, before any connection: the caller's configuration or request, which
  // no callee failed and sending again cannot mend (the agent would re-issue them, and the 502's
  // remedy points at the callee).
  it("a call fetch will not make (a blocked port, an unknown scheme, a malformed header) is not upstream_failed", async () => {
    const live = await serve((_req, res) => res.end("{}"));
    const refused = [
      postJson("http://127.0.0.1:6000/v1/chat/completions", {}), // on fetch's bad-port list
      postJson("ftp://127.0.0.1/x", {}),
      postJson(`${live}/x`, {}, { headers: { "transfer-encoding": "chunked" } }),
    ];
    for (const error of await Promise.all(refused.map(failure))) {
      // fetch's own refusal, passed on as it is: a call that was made (failure's "the call
      // succeeded") is no such call, and would pass a check for "not upstream_failed" alone.
      expect(error).toBeInstanceOf(TypeError);
      expect(error).not.toMatchObject({ code: "upstream_failed" });
    }
  });

  it("a call aborted by its caller is the caller's abort, not upstream_failed", async () => {
    const url = await serve(() => undefined); // never answers
    const abort = new AbortController();
    const call = failure(postJson(`${url}/x`, {}, { signal: abort.signal }));
    abort.abort(new Error("retired"));
    const error = await call;
    expect(error).not.toBeInstanceOf(CheckpointError);
    expect(error).toMatchObject({ message: "retired" });
  });
});
