import { describe, expect, it } from "vitest";
import { EquivalenceJudgeVerifier, JudgeClient } from "../../../participants/verifiers/index.js";

/**
 * A judge URL with `user:password@` cannot work (fetch refuses to build a request from a URL that
 * carries credentials), and fetch's refusal quotes the whole URL: each verify then answered
 * `judge_failed` with the judge's password in its `detail`, to every caller and into its records.
 * The client refuses such a URL when it is built, without echoing it (the API key goes in
 * GYM_CKPT_JUDGE_API_KEY, sent as a bearer token).
 */
const SECRET = "judge-Pa55word";

describe("JudgeClient and a judge URL carrying credentials", () => {
  it.each([`http://judge:${SECRET}@127.0.0.1:9`, `https://${SECRET}@judge.example/v1`])("%s: refused when built, its credentials never in a verify reply", async (baseUrl) => {
    const outcome = await (async () => new EquivalenceJudgeVerifier(new JudgeClient({ baseUrl })).verify({ task: { expected_answer: "4" }, answer: "4" }))().then(
      (reply) => ({ answered: JSON.stringify(reply) }),
      (error: Error) => ({ refused: error.message }),
    );
    expect(JSON.stringify(outcome)).not.toContain(SECRET);
    expect(outcome).toEqual({ refused: expect.stringMatching(/may not carry credentials/) });
  });
});

/**
 * The API key rides in `Authorization: Bearer <key>`: one fetch cannot send (a line break inside it,
 * a NUL) failed every call with fetch's refusal, which quotes the whole header value, so each verify
 * answered `judge_failed` with the key in its `detail`. The client refuses, when it is built and
 * without echoing it, any key but visible ASCII, as for our own tokens (BearerTokenSchema).
 */
describe("JudgeClient and an API key no header can carry", () => {
  it.each([`${SECRET}\nx`, `${SECRET}\r\nx`, `${SECRET}\u0000`])("%j: refused when built, the key never in a verify reply", async (apiKey) => {
    const outcome = await (async () => new EquivalenceJudgeVerifier(new JudgeClient({ baseUrl: "http://127.0.0.1:9", apiKey })).verify({ task: { expected_answer: "4" }, answer: "4" }))().then(
      (reply) => ({ answered: JSON.stringify(reply) }),
      (error: Error) => ({ refused: error.message }),
    );
    expect(JSON.stringify(outcome)).not.toContain(SECRET);
    expect(outcome).toEqual({ refused: expect.stringMatching(/GYM_CKPT_JUDGE_API_KEY/) });
  });
});

/**
 * A base URL that does not parse at all (a bad port, an unclosed `[`) made `new URL` throw a
 * TypeError whose `input` property holds the whole text, which pino logs with the error: the
 * password with it. Refused with an error of its own.
 */
describe("JudgeClient and a judge URL that does not parse", () => {
  it.each([`http://judge:${SECRET}@127.0.0.1:99999`, `http://judge:${SECRET}@127.0.0.1:9:9`])("%s: refused without the text anywhere on the error", (baseUrl) => {
    let caught: unknown;
    try {
      new JudgeClient({ baseUrl });
    } catch (error) {
      caught = error;
    }
    expect(caught).toBeInstanceOf(Error);
    expect(JSON.stringify({ ...(caught as object), message: (caught as Error).message, stack: (caught as Error).stack })).not.toContain(SECRET);
    expect((caught as Error).message).toMatch(/the judge URL is not a URL/);
  });
});
