import { EventEmitter } from "node:events";
import type { ServerResponse } from "node:http";
import type { Dispatcher } from "undici";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { waitUntil } from "../../support/wait-until.js";
import { ForwardedCall } from "../../../participants/attach/forwarded-call.js";
import type { AdmissionTicket } from "../../../participants/kinds/model/index.js";
import { CHAT, chat, modelFixture, settle, type ModelFixture } from "./model-fixtures.js";

/**
 * The caller's response as ForwardedCall sees it. `end()` ends it without 'finish': the test says
 * when the last write's callback runs ('finish'), or that the socket died first ('close' only).
 * Node's `writableFinished` is computed (ended, nothing buffered), so it reads true once a dead
 * socket dropped its buffer, whether or not the bytes ever left.
 */
class CallerResponse extends EventEmitter {
  headersSent = false;
  destroyed = false;
  writableEnded = false;
  writableFinished = false;
  writableNeedDrain = false;
  socket = {};
  writeHead(): this {
    this.headersSent = true;
    return this;
  }
  write(): boolean {
    return true;
  }
  end(): this {
    this.writableEnded = true;
    this.writableFinished = true;
    return this;
  }
  destroy(): this {
    if (this.destroyed) return this;
    this.destroyed = true;
    this.emit("close");
    return this;
  }
}

const upstream = { abort() {}, pause() {}, resume() {} } as unknown as Dispatcher.DispatchController;

let f: ModelFixture;
beforeEach(async () => {
  f = await modelFixture();
});
afterEach(async () => {
  // A ticket left open (the defect these tests look for) would keep close() waiting.
  for (const ticket of [...f.kind.tickets.values()]) f.kind.fail(ticket);
  await f.close();
});

/** One call of `key` answered in full by the upstream; resolves once its row is written and its response ended. */
async function answeredCall(key: string): Promise<{ ticket: AdmissionTicket; res: CallerResponse }> {
  const ticket = await f.kind.admit(key, CHAT, chat("hi"));
  const res = new CallerResponse();
  const call = new ForwardedCall(res as unknown as ServerResponse, ticket, f.kind, undefined, 30_000);
  call.onRequestStart(upstream);
  call.onResponseStart(upstream, 200, { "content-length": "2" });
  call.onResponseData(upstream, Buffer.from("ok"));
  call.onResponseEnd();
  // The row's append is synced to disk before the end.
  await waitUntil(() => res.writableEnded, "the response's end, once its row is synced");
  return { ticket, res };
}

/** Whether the ticket closed within a couple of seconds (its row's removal is file I/O). */
async function closes(ticket: AdmissionTicket): Promise<boolean> {
  const gaveUp = new Promise<false>((resolve) => setTimeout(() => resolve(false), 2000).unref());
  return Promise.race([ticket.closed.then(() => true), gaveUp]);
}

const rowsOf = async (key: string) => (await f.kind.captureManifest(key)).records.length;

describe("ForwardedCall: a caller's connection closing around the response's end", () => {
  it("closed after the end but before 'finish' (the socket died under the last write): the row is taken back, the ticket closes and a retire of its attempt finishes", async () => {
    const { ticket, res } = await answeredCall("r1");
    res.destroy();
    expect(await closes(ticket)).toBe(true);
    expect(f.kind.tickets.size).toBe(0);
    expect(await rowsOf("r1")).toBe(0);
    await f.kind.retire([{ rollout_id: "r1", attempt: 0 }]);
  });

  it("'finish' then 'close' (delivered, then the connection ended): the row stays", async () => {
    const { ticket, res } = await answeredCall("r2");
    res.emit("finish");
    res.destroy();
    expect(await closes(ticket)).toBe(true);
    await settle();
    expect(await rowsOf("r2")).toBe(1);
  });

  it("a 'finish' after the 'close' changes nothing: the close already took the row back", async () => {
    const { ticket, res } = await answeredCall("r3");
    res.destroy();
    res.emit("finish");
    expect(await closes(ticket)).toBe(true);
    await settle();
    expect(await rowsOf("r3")).toBe(0);
  });
});
