import { writeSync } from "node:fs";
import { rm } from "node:fs/promises";
import { request, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import type { ModelKind } from "../../participants/kinds/model/index.js";

/** What the attach proxy tests with a fake upstream share: a loopback listener, a streamed call, a full disk, teardown. */

/** Listens on a free 127.0.0.1 port; resolves to the server's http URL. */
export function listenLocal(server: Server): Promise<string> {
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(`http://127.0.0.1:${(server.address() as AddressInfo).port}`)));
}

/** POSTs a streamed chat completion for capture key `key` and reads the whole answer. */
export function postStreamedChat(baseUrl: string, key: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(`${baseUrl}/ng-rollout/${key}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" } }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: "hi" }] }));
  });
}

/** A ledger write that fails with ENOSPC while `full()` says the disk is full. */
export function ledgerWriteFailingWhen(full: () => boolean): (fd: number, buffer: Buffer, offset: number) => number {
  return (fd, buffer, offset) => {
    if (full()) throw Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC", errno: -28, syscall: "write" });
    return writeSync(fd, buffer, offset);
  };
}

/** Drops every connection, closes proxy and upstream, the model kind, and removes `dir`. */
export async function closeAttachFixture({ proxy, upstream, kind, dir }: { proxy: Server; upstream: Server; kind: ModelKind; dir: string }): Promise<void> {
  proxy.closeAllConnections();
  upstream.closeAllConnections();
  await Promise.all([new Promise((r) => proxy.close(r)), new Promise((r) => upstream.close(r))]);
  await kind.close();
  await rm(dir, { recursive: true, force: true });
}
