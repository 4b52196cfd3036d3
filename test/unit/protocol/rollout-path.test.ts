import { describe, expect, it } from "vitest";
import { parseRolloutPath, rolloutPath } from "../../../protocol/index.js";

describe("rollout path prefix", () => {
  it("parses the capture key and the route after it", () => {
    expect(parseRolloutPath("/ng-rollout/r1-a2/v1/chat/completions")).toEqual({
      episode: { rollout_id: "r1", attempt: 2 },
      captureKey: "r1-a2",
      route: "/v1/chat/completions",
    });
    expect(parseRolloutPath(rolloutPath("r.1", "/seed_session"))).toMatchObject({ captureKey: "r.1", route: "/seed_session" });
    expect(parseRolloutPath("/v1/models")).toBeUndefined();
  });

  it("answers invalid, never throws, for a key that does not decode or parse", () => {
    expect(parseRolloutPath("/ng-rollout/%E0/x")).toBe("invalid");
    expect(parseRolloutPath("/ng-rollout/%/x")).toBe("invalid");
    expect(parseRolloutPath("/ng-rollout/a b/x")).toBe("invalid");
  });
});
