import { describe, expect, it } from "vitest";
import { DEFAULT_NATS_URL, kvReplicas, natsConnectTimeoutMs, natsSettings } from "../../../protocol/index.js";

describe("kvReplicas: the KV buckets' replicas, one rule in every process", () => {
  it("is 1 on a single server and 3 on a cluster, whatever it advertises (fewer during a node's outage)", () => {
    expect(kvReplicas({}, {})).toBe(1);
    expect(kvReplicas(undefined, {})).toBe(1);
    expect(kvReplicas({ cluster: "c", connect_urls: ["a:1", "b:1", "c:1", "d:1", "e:1"] }, {})).toBe(3);
    expect(kvReplicas({ cluster: "c", connect_urls: ["a:1", "b:1"] }, {})).toBe(3);
    expect(kvReplicas({ cluster: "c" }, {})).toBe(3); // a cluster that does not advertise its servers
  });

  it("follows GYM_CKPT_NATS_REPLICAS, and refuses a value JetStream cannot take", () => {
    expect(kvReplicas({ cluster: "c", connect_urls: ["a:1", "b:1", "c:1"] }, { GYM_CKPT_NATS_REPLICAS: "1" })).toBe(1);
    expect(kvReplicas({}, { GYM_CKPT_NATS_REPLICAS: " 5 " })).toBe(5);
    expect(kvReplicas({}, { GYM_CKPT_NATS_REPLICAS: "" })).toBe(1); // empty = unset
    for (const bad of ["0", "6", "3.0", "three", "0x3"]) {
      expect(() => kvReplicas({}, { GYM_CKPT_NATS_REPLICAS: bad })).toThrow(expect.objectContaining({ code: "invalid_request" }));
    }
  });
});

describe("natsSettings", () => {
  it("takes an empty GYM_CKPT_NATS_URL for unset (the default server), as the coordinator's config does", () => {
    expect(natsSettings(undefined, { GYM_CKPT_NATS_URL: "" }).servers).toEqual([DEFAULT_NATS_URL]);
    expect(natsSettings(undefined, { GYM_CKPT_NATS_URL: "nats://a:1, nats://b:2" }).servers).toEqual(["nats://a:1", "nats://b:2"]);
    expect(natsSettings("nats://flag:3", { GYM_CKPT_NATS_URL: "nats://a:1" }).servers).toEqual(["nats://flag:3"]);
  });
});

describe("GYM_CKPT_NATS_CONNECT_TIMEOUT_MS: how long one first connect waits for the server's INFO", () => {
  it("is unset by default (nats.js's own 20 s), else passed to connect as its timeout", () => {
    expect(natsConnectTimeoutMs({})).toBeUndefined();
    expect(natsConnectTimeoutMs({ GYM_CKPT_NATS_CONNECT_TIMEOUT_MS: "" })).toBeUndefined(); // empty = unset
    expect(natsSettings(undefined, {})).not.toHaveProperty("timeout");
    expect(natsConnectTimeoutMs({ GYM_CKPT_NATS_CONNECT_TIMEOUT_MS: "2000" })).toBe(2000);
    expect(natsConnectTimeoutMs({ GYM_CKPT_NATS_CONNECT_TIMEOUT_MS: "600000" })).toBe(600_000);
    expect(natsSettings(undefined, { GYM_CKPT_NATS_CONNECT_TIMEOUT_MS: "1500" }).timeout).toBe(1500);
  });

  it("refuses anything but a whole number of milliseconds from 1 to 600000, as configuration", () => {
    for (const bad of ["0", "-5", "600001", "1.5", "2e3", "0x10", "ten", " "]) {
      expect(() => natsConnectTimeoutMs({ GYM_CKPT_NATS_CONNECT_TIMEOUT_MS: bad }), bad).toThrow(expect.objectContaining({ code: "invalid_request" }));
      expect(() => natsSettings(undefined, { GYM_CKPT_NATS_CONNECT_TIMEOUT_MS: bad }), bad).toThrow(expect.objectContaining({ code: "invalid_request" }));
    }
  });
});
