import { describe, expect, it } from "vitest";
import { defaultReadyTimeoutMs } from "../../../participants/gym/gym-launcher.js";

/**
 * docs/gym.md: GYM_CKPT_NATS_CONNECT_WAIT_MS is how long each server of `gym-ckpt gym` waits for a
 * NATS server that does not accept connections yet. The launcher gave every server a fixed 20 s for
 * its ready line, so a Gym started a minute before its NATS (a wait of 60000) failed after 20 s.
 */
describe("the launcher's default ready timeout", () => {
  it("is the servers' wait for NATS plus 10 s", () => {
    expect(defaultReadyTimeoutMs({ GYM_CKPT_NATS_CONNECT_WAIT_MS: "60000" })).toBe(70_000);
    expect(defaultReadyTimeoutMs({ GYM_CKPT_NATS_CONNECT_WAIT_MS: "0" })).toBe(10_000);
  });

  it("is 20 s with the default wait, or a value the servers would refuse (they then end at once)", () => {
    expect(defaultReadyTimeoutMs({})).toBe(20_000);
    expect(defaultReadyTimeoutMs({ GYM_CKPT_NATS_CONNECT_WAIT_MS: "1e4" })).toBe(20_000);
    expect(defaultReadyTimeoutMs({ GYM_CKPT_NATS_CONNECT_WAIT_MS: "99999999999" })).toBe(20_000);
  });
});
