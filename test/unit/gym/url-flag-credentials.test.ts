import { describe, expect, it } from "vitest";
import { postJson } from "../../../participants/gym/agent-server/gym-http.js";
import { urlFlagsRefusal } from "../../../participants/gym/server-runtime.js";
import { toCheckpointError } from "../../../protocol/index.js";

/**
 * The agent's --policy-url / --resources-url and the environment's --agent-url / --resources-url
 * are fetched on every call. One carrying `user:password@` cannot work: fetch refuses to build the
 * request, and its refusal quotes the whole URL, so the password went into the caller's
 * `internal_error` detail (and from there into the environment's reply, the collector's log and
 * its results). Such a flag is refused at start-up (exit 2), the value not echoed, as the CLI's
 * --run-url and the attach proxy's --upstream are.
 */
const SECRET = "gym-Pa55word";

describe("a reference server's URL flags carrying credentials", () => {
  it("fetch's own refusal of such a URL quotes the password: what every call answered", async () => {
    const reply = await postJson(`http://agent:${SECRET}@127.0.0.1:9/run`, {}).then(
      () => undefined,
      (error: unknown) => toCheckpointError(error).toReply(),
    );
    expect(JSON.stringify(reply)).toContain(SECRET);
  });

  it.each([
    [{ "policy-url": `http://user:${SECRET}@127.0.0.1:9`, "resources-url": "http://127.0.0.1:9" }, "--policy-url"],
    [{ "agent-url": "http://127.0.0.1:9", "resources-url": `https://${SECRET}@127.0.0.1:9/v1` }, "--resources-url"],
  ])("%j: %s refused at start-up without echoing it", (flags, flag) => {
    const refusal = urlFlagsRefusal(flags, Object.keys(flags));
    expect(refusal).toBe(`${flag} may not carry credentials (user:password@)`);
  });

  it("URLs without credentials still pass", () => {
    expect(urlFlagsRefusal({ "agent-url": "http://127.0.0.1:9", "resources-url": "https://host.example/x@y" }, ["agent-url", "resources-url"])).toBeUndefined();
  });
});
