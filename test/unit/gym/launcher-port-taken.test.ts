import { describe, expect, it } from "vitest";
import { namesTakenPort } from "../../../participants/gym/gym-launcher.js";

/** The launcher retries a server start on another port only when that server's own port was taken. */
describe("gym launcher: which port a failed start says was taken", () => {
  it("its own port, not one whose number merely begins with it (a metrics port 40001 beside port 4000)", () => {
    const own = ['{"level":50,"msg":"listen EADDRINUSE: address already in use 127.0.0.1:4000"}'];
    const metrics = ['{"level":50,"msg":"listen EADDRINUSE: address already in use 127.0.0.1:40001"}'];
    expect(namesTakenPort(own, 4000)).toBe(true);
    expect(namesTakenPort(metrics, 4000)).toBe(false);
    expect(namesTakenPort(metrics, 40001)).toBe(true);
    expect(namesTakenPort(["listening on 127.0.0.1:4000"], 4000)).toBe(false);
  });
});
