import { describe, expect, it } from "vitest";
import { redactUrl } from "../../../protocol/index.js";

/** URLs shown in messages and logs: credentials in userinfo or query never, the rest as given. */
describe("redactUrl", () => {
  it.each([
    ["http://127.0.0.1:8000/run", "http://127.0.0.1:8000/run"],
    ["http://user:SECRET-abc123@127.0.0.1:8000/run", "http://[Redacted]@127.0.0.1:8000/run"],
    ["https://gw.example/api/run?code=SECRET-abc123", "https://gw.example/api/run?[Redacted]"],
    ["http://h/run#access_token=SECRET-abc123", "http://h/run#[Redacted]"],
    ["user:SECRET-abc123@127.0.0.1:8480", "[Redacted]@127.0.0.1:8480"],
    // A `?` inside the password must not cut the userinfo short; nor an `@` in the query (or
    // fragment) show the query's rest after it. The text cannot tell them apart: only the scheme is kept.
    ["http://u:pa?SECRET-abc123@h:1/run?k=SECRET-abc123", "http://[Redacted]"],
    ["https://gw.example/run?user=a@b.example&key=SECRET-abc123", "https://[Redacted]"],
    ["http://h/run#state=a@b&access_token=SECRET-abc123", "http://[Redacted]"],
  ])("%s → %s", (raw, shown) => {
    expect(redactUrl(raw)).toBe(shown);
    expect(redactUrl(raw)).not.toContain("SECRET");
  });
});
