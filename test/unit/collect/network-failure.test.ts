import { describe, expect, it } from "vitest";
import { NetworkFailure, networkFailureCode } from "../../../coordinator/client/network-failure.js";

const fetchFailed = (code: string) => Object.assign(new TypeError("fetch failed"), { cause: Object.assign(new Error(`read ${code}`), { code }) });

describe("networkFailureCode", () => {
  it("names the expected network failures of a /run: refused, reset, dropped, timed out (ours included)", () => {
    expect(networkFailureCode(fetchFailed("ECONNREFUSED"))).toBe("ECONNREFUSED");
    expect(networkFailureCode(fetchFailed("ECONNRESET"))).toBe("ECONNRESET");
    expect(networkFailureCode(fetchFailed("UND_ERR_SOCKET"))).toBe("UND_ERR_SOCKET");
    expect(networkFailureCode(new DOMException("the /run call timed out", "TimeoutError"))).toBe("TimeoutError");
  });

  it("anything else is unexpected (logged with its stack)", () => {
    expect(networkFailureCode(new Error("/run answered 500"))).toBeUndefined();
    expect(networkFailureCode(fetchFailed("ERR_SOMETHING_ELSE"))).toBeUndefined();
    expect(networkFailureCode(new DOMException("the collection stopped", "AbortError"))).toBeUndefined();
    expect(networkFailureCode(undefined)).toBeUndefined();
  });

  it("a NetworkFailure keeps the message of the failure and its cause and its code, not the HTTP client's stack", () => {
    const failure = new NetworkFailure(fetchFailed("ECONNRESET"), "ECONNRESET");
    expect(failure.message).toBe("fetch failed: read ECONNRESET");
    expect(failure.code).toBe("ECONNRESET");
    expect(failure.stack).toBeUndefined();
  });
});
