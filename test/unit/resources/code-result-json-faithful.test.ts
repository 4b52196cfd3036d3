import { describe, expect, it } from "vitest";
import { CodeVerifier } from "../../../participants/verifiers/index.js";
import { CODE_LIMITS, verifyOnce } from "./verify-once.js";

/**
 * docs/verifiers.md: the code verifier compares a case's result with `expected` as canonical JSON.
 * JSON.stringify writes a Promise, a Map, a Set (any object whose content lives in internal slots)
 * as `{}`, and a function, a symbol or `undefined` inside an array as `null`: an async function, or
 * one answering `new Map()`, passed a case expecting `{}`, and `[undefined]` one expecting `[null]`.
 * (As an object's property they are dropped, as JSON does: that stays.)
 * Such a result is now a case `error`.
 */

async function verify(payload: object) {
  return (await verifyOnce(new CodeVerifier(CODE_LIMITS), payload)).body;
}

async function cases(results: string[], expected: unknown[]) {
  const answer = `function f(i) { return [${results.join(", ")}][i](); }`;
  const tests = expected.map((value, index) => ({ args: [index], expected: value }));
  return (await verify({ task: { function_name: "f", tests }, answer })).cases;
}

describe("code verifier: results JSON cannot hold faithfully", () => {
  it("are case errors, never equal to {} or null", async () => {
    const results = [
      "async () => ({})",
      "() => Promise.resolve({})",
      "() => new Map([[1, 2]])",
      "() => new Set([1])",
      "() => new WeakMap()",
      "() => new WeakSet()",
      "() => /x/",
      "() => new Error('x')",
      "() => [undefined]",
      "() => [() => 1]",
      "() => [Symbol('s')]",
      "() => ({ a: [1, undefined] })",
      "() => () => 1",
      "() => ({ nested: [new Map()] })",
      // A Map that hides what it is behind another prototype and toStringTag is still a Map.
      "() => Object.setPrototypeOf(new Map([[1, 2]]), Object.prototype)",
      // A Promise whose constructor getter would break a then()-based check.
      "() => { const p = Promise.resolve(1); Object.defineProperty(p, 'constructor', { get() { throw new TypeError('no'); } }); return p; }",
      "() => [1, , 3]",
      "() => Object(Symbol('s'))",
    ];
    const expected = [{}, {}, {}, {}, {}, {}, {}, {}, [null], [null], [null], { a: [1, null] }, null, { nested: [{}] }, {}, {}, [1, null, 3], {}];
    expect(await cases(results, expected)).toEqual(results.map(() => "error"));
  });

  it("leave every faithful result as it was: undefined, function and symbol properties dropped, toJSON, boxes, class instances", async () => {
    const results = [
      "() => ({ a: 1, b: undefined })",
      // A factory's methods: JSON drops them, and a task's expected value (JSON) cannot hold them either.
      "() => ({ count: 0, increment() {}, tag: Symbol('s') })",
      "() => new Date(0)",
      "() => ({ toJSON() { return [1, 2]; } })",
      "() => [new Number(1), new String('s'), new Boolean(false)]",
      "() => { class P { constructor() { this.x = 1; } m() {} } return new P(); }",
      "() => Object.assign(Object.create(null), { a: [1, { b: null }] })",
      "() => { const m = new Map([[1, 2]]); m.toJSON = () => [...m]; return m; }",
      "() => null",
      "() => new Proxy({ a: 1 }, {})",
    ];
    const expected = [{ a: 1 }, { count: 0 }, "1970-01-01T00:00:00.000Z", [1, 2], [1, "s", false], { x: 1 }, { a: [1, { b: null }] }, [[1, 2]], null, { a: 1 }];
    expect(await cases(results, expected)).toEqual(results.map(() => "pass"));
  });
});
