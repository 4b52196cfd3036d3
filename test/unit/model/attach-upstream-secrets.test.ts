import { describe, expect, it } from "vitest";
import { parseUpstream } from "../../../participants/attach/upstream-url.js";

/**
 * `gym-ckpt attach model --upstream URL` prints its refusal (`attach model: <message>`, exit 2) on
 * stderr, which supervisors keep in their logs: credentials in the URL must not be echoed there.
 */
describe("--upstream refusals", () => {
  it("do not echo the URL's password", () => {
    for (const raw of ["http://user:s3cret-pw@host:99999/v1", "http://user:s3cret-pw@host:8000/v1?x=1", "ftp://user:s3cret-pw@host/v1"]) {
      let message = "";
      try {
        parseUpstream(raw);
      } catch (error) {
        message = (error as Error).message;
      }
      expect(message, raw).not.toBe("");
      expect(message, raw).not.toContain("s3cret-pw");
    }
  });

  it("refuse credentials in a valid URL instead of silently dropping them", () => {
    expect(() => parseUpstream("http://user:s3cret-pw@127.0.0.1:8000/v1")).toThrow(/may not carry credentials/);
    expect(() => parseUpstream("http://token@127.0.0.1:8000/v1")).toThrow(/may not carry credentials/);
    expect(parseUpstream("http://127.0.0.1:8000/v1").root).toBe("http://127.0.0.1:8000");
  });
});
