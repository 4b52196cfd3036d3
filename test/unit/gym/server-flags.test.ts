import { describe, expect, it } from "vitest";
import { LaunchFlagsSchema, ServerFlagsSchema, millisecondFlagRefusal } from "../../../participants/gym/server-runtime.js";

/**
 * docs/api.md §4-5: numbers on a command line are decimal, and a flag given an empty value is that
 * value, never the flag left out. A reference server's or the attach proxy's `--port ""` (an unset
 * "$PORT") was coerced to 0, "any free port", so the proxy served where nobody would reach it;
 * `--port 0x1F90` was port 8080.
 */
const base = { nats: "nats://127.0.0.1:4222", natsConnectWaitMs: "10000", deployment: "default", instance: "env1", token: "t0ken", port: "0" };

describe("reference server flags", () => {
  it.each([
    ["port", ""],
    ["port", " "],
    ["port", "0x1F90"],
    ["port", "1e3"],
    ["port", "80.0"],
    ["metricsPort", ""],
    ["metricsPort", "0x10"],
    ["leaseGraceSeconds", "1e3"],
    ["leaseGraceSeconds", "0x10"],
    ["leaseGraceSeconds", ""],
    ["natsConnectWaitMs", ""],
    ["natsConnectWaitMs", "1e3"],
    ["natsConnectWaitMs", "2.5"],
    ["natsConnectWaitMs", "600001"],
  ])("%s %j is refused", (key, value) => {
    expect(ServerFlagsSchema.safeParse({ ...base, [key]: value }).success).toBe(false);
  });

  it("decimal values are taken", () => {
    const parsed = ServerFlagsSchema.parse({ ...base, port: "8080", metricsPort: "0", leaseGraceSeconds: "2.5", natsConnectWaitMs: "0" });
    expect({ port: parsed.port, metricsPort: parsed.metricsPort, leaseGraceSeconds: parsed.leaseGraceSeconds, natsConnectWaitMs: parsed.natsConnectWaitMs }).toEqual({ port: 8080, metricsPort: 0, leaseGraceSeconds: 2.5, natsConnectWaitMs: 0 });
  });

  it("gym-ckpt gym refuses --lease-grace-seconds 1e3 as the servers do", () => {
    expect(LaunchFlagsSchema.safeParse({ nats: base.nats, natsConnectWaitMs: "10000", deployment: "default", token: "t0ken", leaseGraceSeconds: "1e3" }).success).toBe(false);
  });
});

describe("a reference server's own --*-ms flags", () => {
  it.each(["abc", "", " 5 ", "0x10", "1e3", "-1", ".5", String(2 ** 31)])("%j is refused, naming the flag", (value) => {
    expect(millisecondFlagRefusal({ "episode-timeout-ms": value })).toBe("--episode-timeout-ms must be a decimal number of milliseconds from 0 to 2147483647");
  });

  it("decimal counts and flags left out are taken; other flags are not its business", () => {
    expect(millisecondFlagRefusal({ "cut-timeout-ms": "10000", "token-delay-ms": "2.5", "episode-timeout-ms": undefined, port: "0x10", help: false })).toBeUndefined();
  });
});
