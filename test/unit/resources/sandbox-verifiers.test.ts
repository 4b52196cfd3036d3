import { describe, expect, it } from "vitest";
import { createResourcesApp } from "../../../participants/kinds/resources/index.js";
import { CodeVerifier, CompetitiveProgrammingVerifier, runSandboxed } from "../../../participants/verifiers/index.js";

const LIMITS = { memoryMb: 48, caseTimeoutMs: 500, startupMs: 4000, maxOutputBytes: 256 * 1024 };
const addTask = { function_name: "add", tests: [{ args: [1, 2], expected: 3 }, { args: [-5, 5], expected: 0 }] };

async function verify(server: CodeVerifier | CompetitiveProgrammingVerifier, payload: object) {
  const { app } = await createResourcesApp(server);
  try {
    const reply = await app.inject({ method: "POST", url: "/ng-rollout/r1/verify", payload });
    return { status: reply.statusCode, body: reply.json() };
  } finally {
    await app.close();
  }
}

describe("code verifier", () => {
  it("runs a submitted function against the test cases", async () => {
    const good = await verify(new CodeVerifier(LIMITS), { task: addTask, answer: "```js\nfunction add(a, b) { return a + b; }\n```" });
    expect(good).toEqual({ status: 200, body: { reward: 1, status: "completed", passed: 2, total: 2, cases: ["pass", "pass"] } });
    const half = await verify(new CodeVerifier(LIMITS), { task: addTask, answer: "const add = (a, b) => a + b + (a < 0 ? 1 : 0);" });
    expect(half.body).toMatchObject({ reward: 0.5, cases: ["pass", "fail"] });
    const broken = await verify(new CodeVerifier(LIMITS), { task: addTask, answer: "function add(" });
    expect(broken.body).toMatchObject({ reward: 0, cases: ["error", "error"] });
  });

  it("contains an infinite loop within the per-case timeout", async () => {
    const started = Date.now();
    const result = await verify(new CodeVerifier(LIMITS), { task: addTask, answer: "function add() { for (;;) {} }" });
    expect(result.body).toMatchObject({ reward: 0, status: "completed", cases: ["timeout", "timeout"] });
    expect(Date.now() - started).toBeLessThan(LIMITS.startupMs + 2 * LIMITS.caseTimeoutMs + 2000);
  });

  it("contains a promise loop and a hostile error getter", async () => {
    const micro = await verify(new CodeVerifier(LIMITS), { task: addTask, answer: "function add() { const spin = () => Promise.resolve().then(spin); spin(); return 1; }" });
    expect(micro.body.reward).toBe(0);
    // Whichever limit trips first under load (heap, per-case timeout or wall clock), nothing passes.
    expect(micro.body.passed).toBe(0);
    if (micro.body.status === "completed") expect(micro.body.cases).not.toContain("pass");
    else expect(["memory_limit", "timeout"]).toContain(micro.body.status);
    const getter = await runSandboxed(
      { mode: "function", code: "function f() { throw { get message() { for (;;) {} } }; }", function_name: "f", cases: [{ args: [] }] },
      LIMITS,
    );
    // The sandbox reads error fields without invoking getters, so the case simply fails.
    expect(getter).toEqual({ status: "completed", results: [{ status: "error", error: "Error: undefined" }] });
  });

  it("contains a memory bomb within the heap limit", async () => {
    const result = await verify(new CodeVerifier(LIMITS), {
      task: addTask,
      answer: "function add() { const hog = []; for (;;) hog.push('x'.repeat(1024) + hog.length); }",
    });
    // On a loaded machine the per-case timeout can trip before the heap limit; both contain it.
    if (result.body.status === "completed") expect(result.body).toMatchObject({ reward: 0, passed: 0, cases: ["timeout", "timeout"] });
    else expect(result.body).toEqual({ reward: 0, status: "memory_limit", passed: 0, total: 2 });
    // Off-heap allocation is not available inside the sandbox.
    const offHeap = await runSandboxed({ mode: "function", code: "function f() { return new ArrayBuffer(2 ** 30).byteLength; }", function_name: "f", cases: [{ args: [] }] }, LIMITS);
    expect(offHeap).toMatchObject({ status: "completed", results: [{ status: "error", error: expect.stringMatching(/ArrayBuffer is not defined/) }] });
  });

  it("denies file, process and module access", async () => {
    const attempts = [
      "function f() { return require('fs').readFileSync('/etc/passwd', 'utf8'); }",
      "function f() { return process.env; }",
      "function f() { return this.constructor.constructor('return process')().pid; }",
      "function f() { return Function('return process')().pid; }",
      "function f() { return globalThis.constructor.constructor('return require')()('fs').readFileSync('/etc/passwd', 'utf8'); }",
    ];
    for (const code of attempts) {
      const outcome = await runSandboxed({ mode: "function", code, function_name: "f", cases: [{ args: [] }] }, LIMITS);
      expect(outcome.status, code).toBe("completed");
      if (outcome.status !== "completed") continue;
      expect(outcome.results[0]!.status, code).toBe("error");
    }
    const dynamicImport = await runSandboxed(
      { mode: "function", code: "let leaked = 'none'; import('node:fs').then((fs) => { leaked = fs.readFileSync('/etc/passwd', 'utf8'); }, (e) => { leaked = 'denied'; }); function f() { return leaked; }", function_name: "f", cases: [{ args: [] }] },
      LIMITS,
    );
    expect(dynamicImport.status).toBe("completed");
    if (dynamicImport.status === "completed") expect(dynamicImport.results[0]).not.toMatchObject({ output: expect.stringContaining("root:") });
  });

  it("refuses malformed tasks with invalid_request", async () => {
    const result = await verify(new CodeVerifier(LIMITS), { task: { function_name: "a;b", tests: [{ args: [], expected: 1 }] }, answer: "x" });
    expect(result.status).toBe(400);
    expect(result.body.error.code).toBe("invalid_request");
  });
});

describe("competitive programming verifier", () => {
  const task = {
    cases: [
      { input: "3\n1 2 3\n", output: "6\n" },
      { input: "2\n10 -4", output: "6" },
    ],
  };

  it("feeds stdin and compares stdout", async () => {
    const solution = "const lines = input.trim().split('\\n'); const nums = lines[1].split(' ').map(Number); print(nums.reduce((a, b) => a + b, 0));";
    expect((await verify(new CompetitiveProgrammingVerifier(LIMITS), { task, answer: solution })).body).toMatchObject({ reward: 1, passed: 2 });
    const readLineSolution = "readLine(); console.log(readLine().split(' ').map(Number).reduce((a, b) => a + b));";
    expect((await verify(new CompetitiveProgrammingVerifier(LIMITS), { task, answer: readLineSolution })).body.reward).toBe(1);
    const wrong = "print(0)";
    expect((await verify(new CompetitiveProgrammingVerifier(LIMITS), { task, answer: wrong })).body).toMatchObject({ reward: 0, cases: ["wrong_answer", "wrong_answer"] });
  });

  it("contains runaway and hostile programs", async () => {
    expect((await verify(new CompetitiveProgrammingVerifier(LIMITS), { task, answer: "while (true) {}" })).body).toMatchObject({ reward: 0, cases: ["timeout", "timeout"] });
    // Which limit trips first depends on CPU speed (heap vs per-case timeout); either way nothing passes.
    const flood = await runSandboxed({ mode: "stdio", code: "for (;;) print('y'.repeat(10000))", cases: [{ input: "" }] }, LIMITS);
    if (flood.status === "completed") expect(flood.results).toEqual([{ status: "timeout" }]);
    else expect(["memory_limit", "output_limit"]).toContain(flood.status);
    const reader = await verify(new CompetitiveProgrammingVerifier(LIMITS), { task, answer: "print(require('fs').readFileSync('/etc/passwd','utf8'))" });
    expect(reader.body).toMatchObject({ reward: 0, cases: ["error", "error"] });
  });
});
