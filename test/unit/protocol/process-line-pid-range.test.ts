import { hostname } from "node:os";
import { describe, expect, it } from "vitest";
import { whyOwnerGone, whyProcessLineStale } from "../../../protocol/process-identity.js";

describe("a lock line naming a pid no process can have", () => {
  it("is stale, not live: process.kill refuses such a pid (ERR_INVALID_ARG_TYPE), which is no sign of a running owner", () => {
    // The line's format takes up to 10 digits; kill(2) takes a 32-bit signed pid, Linux none past 2^22.
    for (const pid of [2 ** 31, 4_294_967_296, 9_999_999_999]) {
      expect([pid, whyProcessLineStale(`${pid} ${hostname()}\n`, () => false)]).toEqual([pid, expect.any(String)]);
      expect([pid, whyOwnerGone(pid, undefined)]).toEqual([pid, expect.any(String)]);
    }
    // A live pid stays live.
    expect(whyOwnerGone(process.ppid, undefined)).toBeUndefined();
  });
});
