import { describe, expect, it } from "vitest";
import { neverSentCode } from "../../../coordinator/client/never-sent.js";

/** fetch's failure as undici reports it: a TypeError whose cause is the socket's error. */
const fetchFailed = (code: string, syscall?: string) =>
  Object.assign(new TypeError("fetch failed"), { cause: Object.assign(new Error(`${syscall ?? "read"} ${code}`), { code, ...(syscall && { syscall }) }) });

describe("neverSentCode: out of file descriptors", () => {
  // Measured (Node 20, undici Agent, ulimit -n 256 filled with open files): fetch fails
  // `fetch failed` with cause { code: "EMFILE", syscall: "connect" }: the socket could not be made.
  it("EMFILE and ENFILE at connect: no socket was made, so nothing was sent", () => {
    expect(neverSentCode(fetchFailed("EMFILE", "connect"))).toBe("EMFILE");
    expect(neverSentCode(fetchFailed("ENFILE", "connect"))).toBe("ENFILE");
  });

  it("a host with several addresses: Node's AggregateError carries the first one's code, its errors their syscall", () => {
    const first = Object.assign(new Error("connect EMFILE"), { code: "EMFILE", syscall: "connect" });
    const aggregate = Object.assign(new AggregateError([first, first]), { code: "EMFILE" });
    expect(neverSentCode(Object.assign(new TypeError("fetch failed"), { cause: aggregate }))).toBe("EMFILE");
  });

  it("EMFILE anywhere but a connect proves nothing: not never-sent", () => {
    expect(neverSentCode(fetchFailed("EMFILE", "read"))).toBeUndefined();
    expect(neverSentCode(fetchFailed("EMFILE"))).toBeUndefined();
  });
});
