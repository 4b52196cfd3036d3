import { describe, expect, it } from "vitest";
import { CodeVerifier, CompetitiveProgrammingVerifier, extractCode, submittedCode } from "../../../participants/verifiers/index.js";
import { CODE_LIMITS as LIMITS, verifyOnce } from "./verify-once.js";

/**
 * docs/verifiers.md: the answer may be a fenced code block. A fence's tag was matched only as
 * lower-case `js`/`javascript`, so ```JS and ```JavaScript were no fence; worse, the closing fence of
 * a block tagged otherwise (```Python, ```ts) was read as an opening, and the prose after it ran
 * as the code. Tags are now read in any case, a block in another language is skipped whole, and an
 * answer whose only code is in another language (TypeScript: types do not run as JavaScript) is
 * not run: `unsupported_language`, reward 0.
 */
const addTask = { function_name: "add", tests: [{ args: [1, 2], expected: 3 }] };



describe("fenced code blocks", () => {
  it("are recognised whatever the case of their js/javascript tag", () => {
    expect(extractCode("```JS\nf();\n```")).toBe("f();\n");
    expect(extractCode("```JavaScript\r\nf();```")).toBe("f();");
    expect(extractCode("```Javascript \n\n  f();\n```")).toBe("  f();\n");
  });

  it("skip a block in another language whole, closing fence included", () => {
    const answer = "In Python:\n```Python\ndef f(): pass\n```\nIn JavaScript:\n```js\nfunction f() {}\n```\n";
    expect(extractCode(answer)).toBe("function f() {}\n");
    expect(extractCode("```ts\nconst x: number = 1;\n```\ntext\n```\nuntagged();\n```")).toBe("untagged();\n");
  });

  it("with only another language's code: the language, nothing to run", () => {
    expect(submittedCode("```ts\nfunction add(a: number, b: number) { return a + b; }\n```")).toEqual({ language: "ts" });
    expect(submittedCode("```TypeScript\nx\n```\nand\n```python\ny\n```")).toEqual({ language: "typescript" });
    expect(submittedCode("```js\nf();\n```")).toEqual({ code: "f();\n" });
    // No fenced block at all, or an unclosed one: the answer is the code.
    expect(submittedCode("function f() {}")).toEqual({ code: "function f() {}" });
    expect(submittedCode("```py\nx\n```\n```js\nf();")).toEqual({ code: "```py\nx\n```\n```js\nf();" });
  });

  it("a verify runs the JS block of a mixed answer, and answers unsupported_language for TypeScript", async () => {
    const mixed = "Python first:\n```Python\ndef add(a, b):\n    return a + b\n```\nThen JS:\n```JS\nfunction add(a, b) { return a + b; }\n```";
    expect((await verifyOnce(new CodeVerifier(LIMITS), { task: addTask, answer: mixed })).body).toMatchObject({ reward: 1, cases: ["pass"] });
    const typescript = "```typescript\nfunction add(a: number, b: number): number { return a + b; }\n```";
    expect(await verifyOnce(new CodeVerifier(LIMITS), { task: addTask, answer: typescript })).toEqual({
      status: 200,
      body: { reward: 0, status: "unsupported_language", language: "typescript", passed: 0, total: 1 },
    });
    const cp = { cases: [{ input: "2 3\n", output: "5" }] };
    expect((await verifyOnce(new CompetitiveProgrammingVerifier(LIMITS), { task: cp, answer: "```ts\nprint(5);\n```" })).body).toEqual({
      reward: 0,
      status: "unsupported_language",
      language: "ts",
      passed: 0,
      total: 1,
    });
    expect((await verifyOnce(new CompetitiveProgrammingVerifier(LIMITS), { task: cp, answer: "```JavaScript\nprint(5);\n```" })).body).toMatchObject({ reward: 1 });
  });
});
