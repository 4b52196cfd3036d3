import { afterEach, describe, expect, it } from "vitest";
import { MAX_GYM_REPLY_BYTES, postJson } from "../../../participants/gym/agent-server/gym-http.js";
import { startOversizedBody, type OversizedBodyServer } from "../../support/oversized-body.js";

let server: OversizedBodyServer | undefined;
afterEach(async () => {
  await server?.close();
  server = undefined;
});

describe("reference Gym data-plane calls: reply size", () => {
  it("a reply body past MAX_GYM_REPLY_BYTES is refused payload_too_large and its stream cancelled", async () => {
    server = await startOversizedBody(2 * MAX_GYM_REPLY_BYTES);
    await expect(postJson(`${server.url}/ng-rollout/r1/v1/chat/completions`, {})).rejects.toMatchObject({ code: "payload_too_large" });
    await server.cancelled;
  });
});
