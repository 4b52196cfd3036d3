import { getEventListeners } from "node:events";
import { createServer, type Server } from "node:http";
import { afterEach, describe, expect, it } from "vitest";
import { postJson } from "../../../participants/gym/agent-server/gym-http.js";

let server: Server | undefined;
afterEach(async () => {
  await new Promise((resolve) => server?.close(resolve) ?? resolve(undefined));
  server = undefined;
});

describe("a long-lived signal passed to many data-plane calls (an episode's)", () => {
  it("holds no abort listener of a call once it answered", async () => {
    server = createServer((request, response) => {
      request.resume();
      request.on("end", () => response.writeHead(200, { "content-type": "application/json" }).end('{"ok":true}'));
    });
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const { port } = server.address() as { port: number };
    const episode = new AbortController();
    for (let i = 0; i < 50; i++) {
      expect((await postJson(`http://127.0.0.1:${port}/step`, { i }, { signal: episode.signal })).body).toEqual({ ok: true });
    }
    // fetch's own listener goes only when its request is garbage collected: one per call meanwhile.
    expect(getEventListeners(episode.signal, "abort")).toHaveLength(0);
    // And the signal still ends a call: one in flight, and one started after it aborted.
    const pending = postJson(`http://127.0.0.1:${port}/never`, {}, { signal: episode.signal });
    episode.abort(new Error("episode deadline"));
    await expect(pending).rejects.toThrow("episode deadline");
    await expect(postJson(`http://127.0.0.1:${port}/step`, {}, { signal: episode.signal })).rejects.toThrow("episode deadline");
  });
});
