import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";
import { availableParallelism } from "node:os";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { createResourcesApp } from "../../../participants/kinds/resources/index.js";
import { CodeVerifier, CompetitiveProgrammingVerifier, SANDBOX_SLOTS, liveSandboxes, runSandboxed, stopSandboxes } from "../../../participants/verifiers/index.js";
import { Slots } from "../../../participants/verifiers/sandbox/sandbox-slots.js";
import { alive, descendants, killAll, TrackedProcesses } from "../../support/process-tree.js";
import { waitUntil } from "../../support/wait-until.js";
import { resourcesWorld } from "./resources-world.js";
import { verifyOnce } from "./verify-once.js";

const LIMITS = { memoryMb: 48, caseTimeoutMs: 500, startupMs: 4000, maxCaseOutputChars: 64 * 1024 };
/** Source of a busy wait of `ms` wall-clock milliseconds. */
const busy = (ms: number) => `{ const __t = Date.now(); while (Date.now() - __t < ${ms}) {} }`;
const addTask = { function_name: "add", tests: [{ args: [1, 2], expected: 3 }, { args: [-5, 5], expected: 0 }] };

/**
 * A 127.0.0.1 listener and a process of this user, the targets of an escape: `check` runs with
 * their addresses; afterwards nothing may have reached the listener and the process must live.
 */
async function withEscapeTargets(check: (targets: { port: number; victimPid: number }) => Promise<void>): Promise<void> {
  let received = "";
  const server = createServer((socket) => socket.on("data", (data) => (received += String(data)))).listen(0, "127.0.0.1");
  await new Promise((resolve) => server.once("listening", resolve));
  const victim = spawn("sleep", ["60"]);
  try {
    await check({ port: (server.address() as { port: number }).port, victimPid: victim.pid! });
    await new Promise((resolve) => setTimeout(resolve, 300)); // a connection or kill the escape started lands
    expect(received).toBe("");
    expect([victim.exitCode, victim.signalCode]).toEqual([null, null]);
  } finally {
    victim.kill("SIGKILL");
    server.close();
  }
}

const verify = verifyOnce;

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

  it("gives each case one deadline: top-level code and the call share the per-case timeout", async () => {
    // 700 ms at top level and 700 ms in the call: each alone fits 1 s, together they do not.
    const limits = { ...LIMITS, caseTimeoutMs: 1000 };
    const result = await verify(new CodeVerifier(limits), { task: { function_name: "add", tests: [{ args: [1, 2], expected: 3 }] }, answer: `${busy(700)}\nfunction add(a, b) { ${busy(700)} return a + b; }` });
    expect(result.body).toMatchObject({ reward: 0, status: "completed", cases: ["timeout"] });
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

  it("keeps only plain ECMAScript globals, so nothing outside the heap can be held (Intl, WebAssembly, ...)", async () => {
    // Intl.Segmenter#segment keeps an ICU copy of its string outside the V8 heap: 24 segmenters over
    // one 16 Mi-character string held ~800 MB while the heap stayed under its limit.
    const segmenters = await runSandboxed(
      { mode: "function", code: "function f() { const s = 'x'.repeat(2 ** 24); const kept = []; for (let i = 0; i < 24; i++) kept.push(new Intl.Segmenter('en').segment(s)); return kept.length; }", function_name: "f", cases: [{ args: [] }] },
      LIMITS,
    );
    expect(segmenters).toEqual({ status: "completed", results: [{ status: "error", error: "ReferenceError: Intl is not defined" }] });
    const code = "function f() { return Reflect.ownKeys(globalThis).filter((k) => typeof k === 'string').sort(); }";
    const globals = await runSandboxed({ mode: "function", code, function_name: "f", cases: [{ args: [] }] }, LIMITS);
    expect(globals.status).toBe("completed");
    const names: string[] = globals.status === "completed" && globals.results[0]!.status === "ok" ? JSON.parse(globals.results[0]!.output) : [];
    for (const gone of ["Intl", "WebAssembly", "SharedArrayBuffer", "Atomics", "ArrayBuffer", "DataView", "Uint8Array", "WeakRef", "FinalizationRegistry"]) expect(names).not.toContain(gone);
    // What submissions use is still there (the locale-aware string methods too).
    expect(names).toEqual(expect.arrayContaining(["Array", "JSON", "Map", "Math", "BigInt", "Promise", "print", "readLine", "console", "input"]));
    const strings = await runSandboxed({ mode: "function", code: "function f() { return ['b', 'a'].sort((x, y) => x.localeCompare(y)).join('') + (1234).toLocaleString('en-US'); }", function_name: "f", cases: [{ args: [] }] }, { ...LIMITS, caseTimeoutMs: 3000 });
    expect(strings).toEqual({ status: "completed", results: [{ status: "ok", output: '"ab1,234"' }] });
  });

  it("ends a child whose resident memory passes its limit as memory_limit, whatever holds it", async () => {
    // A resident limit below the heap limit stands in for memory V8's heap limit does not see.
    const limits = { ...LIMITS, memoryMb: 256, residentMb: 120, caseTimeoutMs: 5000 };
    const code = `function f() { const kept = []; for (let i = 0; i < 20; i++) kept.push(Array.from({ length: 2 ** 20 }, () => i));
      const t = Date.now(); while (Date.now() - t < 2000) {} return kept.length; }`;
    const outcome = await runSandboxed({ mode: "function", code, function_name: "f", cases: [{ args: [] }] }, limits);
    expect(outcome).toEqual({ status: "memory_limit", detail: "resident memory above 120 MB" });
    expect(liveSandboxes()).toBe(0);
  });

  it("denies file, process and module access", async () => {
    const attempts = [
      "function f() { return require('fs').readFileSync('/etc/passwd', 'utf8'); }",
      "function f() { return process.env; }",
      "function f() { return this.constructor.constructor('return process')().pid; }",
      "function f() { return Function('return process')().pid; }",
      "function f() { return globalThis.constructor.constructor('return require')()('fs').readFileSync('/etc/passwd', 'utf8'); }",
      // A global accessor read by bare name gets the object the context was made from as `this`
      // (a host-realm object): with a prototype, its constructor would be the host's Object.
      "Object.defineProperty(globalThis, 'g', { get() { return this.constructor.constructor('return process')().pid; } }); function f() { return g; }",
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
    // import() (in the submission, eval or Function code) must not hand out a host-realm value:
    // its constructor's constructor would be the host's Function, with process and require.
    for (const importCall of ["import('x')", "eval(\"import('x')\")", "Function(\"return import('x')\")()"]) {
      const code = `let seen = 'unsettled'; const p = ${importCall};
        seen = 'promise:' + p.constructor.constructor('return typeof process')();
        p.catch((e) => { seen += ' reason:' + e.constructor.constructor('return typeof process')(); });
        function f() { return seen; }`;
      const outcome = await runSandboxed({ mode: "function", code, function_name: "f", cases: [{ args: [] }] }, LIMITS);
      expect(outcome, importCall).toMatchObject({ status: "completed", results: [{ status: "ok" }] });
      if (outcome.status === "completed" && outcome.results[0]!.status === "ok") expect(outcome.results[0]!.output, importCall).not.toContain("object");
    }
  });

  it("lets no escape through import() reach the network or other processes", async () => {
    await withEscapeTargets(async ({ port, victimPid }) => {
      const code = `import('x').catch((e) => {
          const host = e.constructor.constructor;
          const socket = host('return require')()('net').connect(${port}, '127.0.0.1', () => socket.end('escaped'));
          host('return process')().kill(${victimPid}, 'SIGKILL');
        });
        function add(a, b) { return a + b; }`;
      const result = await verify(new CodeVerifier(LIMITS), { task: addTask, answer: code });
      expect(result.body).toEqual({ reward: 1, status: "completed", passed: 2, total: 2, cases: ["pass", "pass"] });
    });
  });

  it("lets no host-realm error (a stack overflow inside Node's own callbacks) hand out a way to run code in the host realm", async () => {
    // Reading an error's stack runs Node's prepareStackTrace callback, and import() its import
    // callback: host-realm functions. Called with the stack all but used up, they overflow it and
    // throw a RangeError made in the host realm, whose constructor's constructor is the host's Function.
    await withEscapeTargets(async ({ port, victimPid }) => {
      const code = `function hostError(probe) {
          let found;
          const dive = () => { try { dive(); } catch {} if (found) return; try { probe(); } catch (e) { if (e && e.constructor !== RangeError) found = e; } };
          dive();
          return found;
        }
        function f(kind) {
          const e = hostError(kind === 'stack' ? () => new Error().stack : () => import('x'));
          if (!e) return 'no host-realm error';
          let seen = 'host-realm error';
          try {
            const hostFunction = e.constructor.constructor;
            hostFunction('return process')().kill(${victimPid}, 'SIGKILL');
            const socket = hostFunction('return require')()('net').connect(${port}, '127.0.0.1', () => socket.end('escaped'));
            seen += ', escaped';
          } catch (x) {
            seen += ', contained: ' + (x && x.message);
          }
          return seen;
        }`;
      const outcome = await runSandboxed({ mode: "function", code, function_name: "f", cases: [{ args: ["stack"] }, { args: ["import"] }] }, LIMITS);
      expect(outcome.status).toBe("completed");
      if (outcome.status === "completed") for (const result of outcome.results) expect(JSON.stringify(result)).not.toContain("escaped");
    });
  });

  it("lets no host-realm intrinsic be changed, so no submission code runs in the child's own code after its case", async () => {
    // A host-realm error (see above) leads to the host's Object.prototype; a getter put there runs
    // whenever the child's own code looks up a property an object lacks: here the toJSON lookup on
    // the results it writes, untimed, where it turned a timed-out case into a computed answer.
    const code = `function hostError() {
        let found;
        const dive = () => { try { dive(); } catch {} if (found) return; try { new Error().stack; } catch (e) { if (e && e.constructor !== RangeError) found = e; } };
        dive();
        return found;
      }
      function f() {
        const hostObjectPrototype = Object.getPrototypeOf(Object.getPrototypeOf(Object.getPrototypeOf(hostError()).constructor.prototype));
        try {
          Object.defineProperty(hostObjectPrototype, 'toJSON', { get() { if (Array.isArray(this.results)) this.results[0] = { status: 'ok', output: '42' }; return undefined; } });
        } catch {}
        for (;;) {}
      }`;
    const outcome = await runSandboxed({ mode: "function", code, function_name: "f", cases: [{ args: [] }] }, LIMITS);
    expect(outcome).toEqual({ status: "completed", results: [{ status: "timeout" }] });
  });

  it("describes hostile thrown values within the case's time, without running their code", async () => {
    const hostile = [
      "function f() { throw { get code() { throw 1; } }; }",
      "function f() { throw new Proxy({}, { getPrototypeOf() { throw 1; } }); }",
      "function f() { throw new Proxy({}, { getPrototypeOf() { for (;;) {} }, get() { for (;;) {} }, getOwnPropertyDescriptor() { for (;;) {} } }); }",
      "function f() { throw Object.create(new Proxy({}, { getPrototypeOf() { for (;;) {} }, getOwnPropertyDescriptor() { for (;;) {} } })); }",
      "function f() { throw { get stack() { for (;;) {} } }; }",
      "function f() { Error.prepareStackTrace = () => { for (;;) {} }; throw new Error('x'); }",
      "function f() { const g = () => 1; g.toString = () => { for (;;) {} }; throw g; }",
      "function f() { throw { message: { toString() { for (;;) {} } } }; }",
    ];
    // A describer that ran the submission's code would loop for ever: the case would time out, however
    // long its time. A generous one keeps a loaded machine's slow child from timing out a correct describer.
    const limits = { ...LIMITS, caseTimeoutMs: 5000 };
    for (const code of hostile) {
      const outcome = await runSandboxed({ mode: "function", code, function_name: "f", cases: [{ args: [] }, { args: [] }] }, limits);
      expect(outcome, code).toMatchObject({ status: "completed", results: [{ status: "error" }, { status: "error" }] });
    }
    // A rejection the submission leaves unhandled is not inspected by the child's host code either.
    const rejected = await runSandboxed(
      { mode: "function", code: "Promise.reject(new Proxy({}, { get() { for (;;) {} }, getOwnPropertyDescriptor() { for (;;) {} } })); function f() { return 1; }", function_name: "f", cases: [{ args: [] }] },
      limits,
    );
    expect(rejected).toEqual({ status: "completed", results: [{ status: "ok", output: "1" }] });
  });

  it("ends its child when the verifier dies, and the kernel bounds the child's CPU time", async () => {
    const source = fileURLToPath(new URL("../../../participants/verifiers/index.ts", import.meta.url));
    const script = `import { runSandboxed } from ${JSON.stringify(source)};
      await runSandboxed({ mode: "function", code: "function f() { for (;;) {} }", function_name: "f", cases: Array.from({ length: 100 }, () => ({ args: [] })) },
        { memoryMb: 48, caseTimeoutMs: 300, startupMs: 10000, maxCaseOutputChars: 1024 });`;
    const verifier = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { stdio: "ignore" });
    const started = new TrackedProcesses().add(verifier.pid!);
    let sandbox: number | undefined;
    try {
      await waitUntil(() => {
        // Once node runs: before its exec, the same process is the shell still setting the limits.
        sandbox = descendants(verifier.pid!).find((p) => p.cmdline.includes("--max-old-space-size=48") && !p.cmdline.startsWith("/bin/sh"))?.pid;
        return sandbox !== undefined;
      }, "the sandbox child");
      started.add(sandbox!);
      expect(readFileSync(`/proc/${sandbox}/limits`, "utf8")).toMatch(/^Max cpu time\s+\d+\s+\d+\s+seconds/m);
      expect(readFileSync(`/proc/${sandbox}/limits`, "utf8")).toMatch(/^Max data size\s+\d+\s+\d+\s+bytes/m);
      verifier.kill("SIGKILL");
      // 100 looping cases would keep an orphan busy for 30 s; it must notice its parent is gone.
      await waitUntil(() => !alive(sandbox!), "the orphaned sandbox child to exit", 8000);
    } finally {
      killAll(started);
    }
  });

  it("answers crashed when the child cannot be spawned for want of file descriptors, and the verifier lives on", async () => {
    // A verifier out of descriptors (each waiting /verify holds a socket): the spawn gets no pipes.
    const source = fileURLToPath(new URL("../../../participants/verifiers/index.ts", import.meta.url));
    const script = `import { closeSync, openSync } from "node:fs";
      import { runSandboxed } from ${JSON.stringify(source)};
      const job = { mode: "function", code: "function f() { return 1; }", function_name: "f", cases: [{ args: [] }] };
      const limits = { memoryMb: 48, caseTimeoutMs: 1000, startupMs: 10000, maxCaseOutputChars: 1024 };
      const fds = [];
      try { for (;;) fds.push(openSync("/dev/null", "r")); } catch {}
      for (const fd of fds.splice(-2)) closeSync(fd);
      const starved = await runSandboxed(job, limits).catch((error) => "threw " + error);
      for (const fd of fds) closeSync(fd);
      const after = await runSandboxed(job, limits);
      process.stdout.write(JSON.stringify({ starved: starved.status ?? starved, after }));`;
    // Its own process group: a kill(0) there (node keeps pid 0 on a child that failed with EMFILE)
    // SIGKILLs that group, so the verifier dies and this test fails, instead of taking the test runner with it.
    const verifier = spawn("/bin/sh", ["-c", 'ulimit -n 200 && exec "$0" "$@"', process.execPath, "--import", "tsx", "--input-type=module", "-e", script], {
      stdio: ["ignore", "pipe", "pipe"],
      detached: true,
    });
    let out = "";
    let err = "";
    verifier.stdout.on("data", (chunk) => (out += String(chunk)));
    verifier.stderr.on("data", (chunk) => (err += String(chunk)));
    const code = await new Promise((resolve) => verifier.on("close", resolve));
    expect({ code, out, err: err.slice(0, 500) }).toEqual({ code: 0, out: JSON.stringify({ starved: "crashed", after: { status: "completed", results: [{ status: "ok", output: "1" }] } }), err: "" });
  });

  it("kills running children on shutdown", async () => {
    const run = runSandboxed({ mode: "function", code: "function f() { for (;;) {} }", function_name: "f", cases: Array.from({ length: 50 }, () => ({ args: [] })) }, LIMITS);
    await waitUntil(() => liveSandboxes() === 1, "a running sandbox child");
    stopSandboxes();
    expect(await run).toMatchObject({ status: "crashed" });
    expect(liveSandboxes()).toBe(0);
  });

  it("runs at most one child per CPU and passes every correct submission under concurrency", async () => {
    const limit = availableParallelism();
    let most = 0;
    const sampler = setInterval(() => {
      most = Math.max(most, descendants(process.pid).filter((p) => p.cmdline.includes("--max-old-space-size=48")).length);
    }, 25);
    try {
      const answer = "function add(a, b) { let s = 0; for (let i = 0; i < 1e6; i++) s += i % 2; return a + b; }";
      const replies = await Promise.all(Array.from({ length: 3 * limit }, () => verify(new CodeVerifier(LIMITS), { task: addTask, answer })));
      for (const reply of replies) expect(reply.body).toEqual({ reward: 1, status: "completed", passed: 2, total: 2, cases: ["pass", "pass"] });
    } finally {
      clearInterval(sampler);
    }
    expect(most).toBeGreaterThan(0);
    expect(most).toBeLessThanOrEqual(limit);
  });

  it("hands the function its args, and compares its result, with own __proto__ keys as sent", async () => {
    // Built by JSON.parse: in an object literal `"__proto__": …` would set the prototype instead.
    const task = JSON.parse(`{"function_name": "f", "tests": [
      {"args": [{"__proto__": {"x": 1}, "b": 2}], "expected": [["__proto__", "b"], true, true]},
      {"args": [], "expected": {"__proto__": 1}}]}`);
    const right = "function f(o) { return o ? [Object.keys(o), Object.getPrototypeOf(o) === Object.prototype, o.x === undefined] : JSON.parse('{\"__proto__\": 1}'); }";
    expect((await verify(new CodeVerifier(LIMITS), { task, answer: right })).body).toEqual({ reward: 1, status: "completed", passed: 2, total: 2, cases: ["pass", "pass"] });
    // The expected value keeps its key too: a result without it is wrong.
    const wrong = "function f(o) { return o ? [Object.keys(o), true, true] : {}; }";
    expect((await verify(new CodeVerifier(LIMITS), { task, answer: wrong })).body).toEqual({ reward: 0.5, status: "completed", passed: 1, total: 2, cases: ["pass", "fail"] });
  });

  it("refuses malformed tasks with invalid_request", async () => {
    const result = await verify(new CodeVerifier(LIMITS), { task: { function_name: "a;b", tests: [{ args: [], expected: 1 }] }, answer: "x" });
    expect(result.status).toBe(400);
    expect(result.body.error.code).toBe("invalid_request");
  });

  it("refuses a reserved word as function_name with invalid_request, before any run (no submission could pass it)", async () => {
    for (const name of ["return", "new", "typeof", "this", "class"]) {
      const result = await verify(new CodeVerifier(LIMITS), { task: { function_name: name, tests: [{ args: [], expected: 1 }] }, answer: "function f() { return 1; }" });
      expect({ name, status: result.status, code: result.body.error?.code }).toEqual({ name, status: 400, code: "invalid_request" });
    }
  });
});

describe("retiring a request whose sandboxed /verify runs or waits for a slot", () => {
  const retire = (a: { call: (op: "retire", body: never, deadlineS: number) => Promise<unknown> }, rollout: string) =>
    a.call("retire", { checkpoint_id: "x1", episode_ids: [{ rollout_id: rollout, attempt: 0 }] } as never, 5).catch((error: unknown) => String(error));
  // 40 looping cases of 500 ms: a run that is not stopped takes 20 s, four times the retire's deadline.
  const looping = { task: { function_name: "f", tests: Array.from({ length: 40 }, () => ({ args: [], expected: 1 })) }, answer: "function f() { for (;;) {} }" };

  it("kills the running child and answers stale_attempt, so the retire finishes by its deadline", async () => {
    const world = await resourcesWorld();
    try {
      const a = await world.harness(new CodeVerifier(LIMITS));
      const seed = await a.post("/ng-rollout/r1/seed_session", {});
      const cookie = String(seed.headers["set-cookie"]).split(";")[0]!;
      const verifying = a.post("/ng-rollout/r1/verify", looping, cookie);
      await waitUntil(() => liveSandboxes() === 1, "the sandbox child");
      const retired = await retire(a, "r1");
      const stillRunning = liveSandboxes();
      stopSandboxes();
      const reply = await verifying;
      expect({ retired, stillRunning, code: reply.json().error?.code }).toEqual({ retired: { retired: ["r1"] }, stillRunning: 0, code: "stale_attempt" });
    } finally {
      await world.close();
    }
  });

  it("takes a run waiting for a slot out of the queue, without waiting for other rollouts' runs", async () => {
    const world = await resourcesWorld();
    const others: Promise<unknown>[] = [];
    try {
      const a = await world.harness(new CodeVerifier(LIMITS));
      // Other rollouts hold every slot.
      for (let i = 0; i < SANDBOX_SLOTS.capacity; i++) others.push(a.post(`/ng-rollout/other${i}/verify`, looping));
      await waitUntil(() => liveSandboxes() === SANDBOX_SLOTS.capacity, "every slot busy");
      const seed = await a.post("/ng-rollout/r1/seed_session", {});
      const cookie = String(seed.headers["set-cookie"]).split(";")[0]!;
      const mine = a.post("/ng-rollout/r1/verify", { task: addTask, answer: "function add(a, b) { return a + b; }" }, cookie);
      await waitUntil(() => SANDBOX_SLOTS.queued === 1, "r1's run waiting for a slot");
      const retired = await retire(a, "r1");
      const queued = SANDBOX_SLOTS.queued;
      stopSandboxes();
      const reply = await mine;
      expect({ retired, queued, code: reply.json().error?.code }).toEqual({ retired: { retired: ["r1"] }, queued: 0, code: "stale_attempt" });
    } finally {
      stopSandboxes();
      await Promise.all(others);
      await world.close();
    }
  });

  it("Slots: an aborted waiter leaves the queue and never runs; the slot goes to the next one", async () => {
    const slots = new Slots(1);
    let release!: () => void;
    const holder = slots.run(() => new Promise<void>((resolve) => (release = resolve)));
    const abort = new AbortController();
    const ran: string[] = [];
    const aborted = slots.run(async () => void ran.push("aborted"), abort.signal);
    const next = slots.run(async () => void ran.push("next"));
    expect(slots.queued).toBe(2);
    abort.abort(new Error("retired"));
    await expect(aborted).rejects.toThrow("retired");
    expect(slots.queued).toBe(1);
    release();
    await Promise.all([holder, next]);
    expect({ ran, active: slots.active, queued: slots.queued }).toEqual({ ran: ["next"], active: 0, queued: 0 });
    await expect(slots.run(async () => 1, abort.signal)).rejects.toThrow("retired");
  });
});

describe("a bounded queue of runs waiting for a sandbox slot", () => {
  it("Slots: a run beyond maxQueued is refused with sandbox_capacity and changes nothing", async () => {
    const slots = new Slots(1, 1);
    let release!: () => void;
    const holder = slots.run(() => new Promise<void>((resolve) => (release = resolve)));
    const queued = slots.run(async () => "queued");
    await expect(slots.run(async () => "refused")).rejects.toMatchObject({ code: "sandbox_capacity" });
    expect([slots.active, slots.queued]).toEqual([1, 1]);
    release();
    expect(await queued).toBe("queued");
    await holder;
    expect([slots.active, slots.queued]).toEqual([0, 0]);
  });

  it("a /verify that finds the queue full answers 503 sandbox_capacity", async () => {
    const looping = { function_name: "f", tests: Array.from({ length: 40 }, () => ({ args: [], expected: 1 })) };
    const { app } = await createResourcesApp(new CodeVerifier(LIMITS));
    const maxQueued = SANDBOX_SLOTS.maxQueued;
    const running: Promise<unknown>[] = [];
    try {
      SANDBOX_SLOTS.maxQueued = 0;
      for (let i = 0; i < SANDBOX_SLOTS.capacity; i++) running.push(app.inject({ method: "POST", url: `/ng-rollout/busy${i}/verify`, payload: { task: looping, answer: "function f() { for (;;) {} }" } }));
      await waitUntil(() => liveSandboxes() === SANDBOX_SLOTS.capacity, "every slot busy");
      const refused = await app.inject({ method: "POST", url: "/ng-rollout/r1/verify", payload: { task: addTask, answer: "function add(a, b) { return a + b; }" } });
      expect([refused.statusCode, refused.json().error.code]).toEqual([503, "sandbox_capacity"]);
    } finally {
      SANDBOX_SLOTS.maxQueued = maxQueued;
      stopSandboxes();
      await Promise.all(running);
      await app.close();
    }
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

  it("gives each case one deadline: the program and the output join it replaced share the per-case timeout", async () => {
    const limits = { ...LIMITS, caseTimeoutMs: 1000 };
    const answer = `${busy(700)}\nprint(6);\n__out.lines.join = function (sep) { ${busy(700)} return Array.prototype.join.call(this, sep); };`;
    const result = await verify(new CompetitiveProgrammingVerifier(limits), { task: { cases: [{ input: "", output: "6" }] }, answer });
    expect(result.body).toMatchObject({ reward: 0, status: "completed", cases: ["timeout"] });
  });

  it("keeps printed output only up to the per-case limit: a flood fails its own case, and a function's logging costs no memory", async () => {
    // Far more than the 48 MB heap: kept whole, it ended the run as memory_limit, every case lost.
    const limits = { ...LIMITS, caseTimeoutMs: 5000 };
    const flood = "const s = 'x'.repeat(1000000); for (let i = 0; i < 300; i++) print(s + i);";
    const cases = { cases: [{ input: "flood", output: "6" }, { input: "", output: "6" }] };
    const printed = await verify(new CompetitiveProgrammingVerifier(limits), { task: cases, answer: `if (input === 'flood') { ${flood} } else print(6);` });
    expect(printed.body).toEqual({ reward: 0, status: "completed", passed: 1, total: 2, cases: ["output_limit", "pass"] });
    // Function mode never reads what was printed: a correct function that logs a lot passes.
    // 120 flat strings of ~590,000 characters: ~70 MB kept, as it was.
    const logging = "function add(a, b) { const state = Array.from({ length: 100000 }, (_, j) => j); for (let i = 0; i < 120; i++) console.log('step', i, JSON.stringify(state)); return a + b; }";
    expect((await verify(new CodeVerifier(limits), { task: addTask, answer: logging })).body).toEqual({ reward: 1, status: "completed", passed: 2, total: 2, cases: ["pass", "pass"] });
    // Output up to the limit (here 65,535 characters of 65,536) is still whole, however many prints made it; one more line is past it.
    const lines = { cases: [{ input: "", output: Array.from({ length: 8192 }, () => "1234567").join("\n") }] };
    expect((await verify(new CompetitiveProgrammingVerifier(LIMITS), { task: lines, answer: "for (let i = 0; i < 8192; i++) print('1234567');" })).body).toMatchObject({ reward: 1, cases: ["pass"] });
    expect((await verify(new CompetitiveProgrammingVerifier(LIMITS), { task: lines, answer: "for (let i = 0; i < 8192; i++) print('1234567'); print('x');" })).body).toMatchObject({ reward: 0, cases: ["output_limit"] });
  });

  it("judges whole outputs up to the per-case limit and never a cut one", async () => {
    const wide = { ...LIMITS, maxCaseOutputChars: 100_000 };
    const long = { cases: [{ input: "", output: "x".repeat(70_000) }] };
    expect((await verify(new CompetitiveProgrammingVerifier(wide), { task: long, answer: "print('x'.repeat(70000))" })).body).toMatchObject({ reward: 1, cases: ["pass"] });
    // Output past the limit is a failure of its own, not a comparison of the part before the cut.
    const padded = await verify(new CompetitiveProgrammingVerifier(LIMITS), { task: { cases: [{ input: "", output: "6" }] }, answer: "print('6' + '\\n'.repeat(65535) + 'WRONG')" });
    expect(padded.body).toEqual({ reward: 0, status: "completed", passed: 0, total: 1, cases: ["output_limit"] });
    // A task whose expected output no case may print is refused, as is a code task's expected value.
    const refused = await verify(new CompetitiveProgrammingVerifier(LIMITS), { task: long, answer: "print('x'.repeat(70000))" });
    expect([refused.status, refused.body.error.code]).toEqual([400, "invalid_request"]);
    const longValue = { function_name: "f", tests: [{ args: [], expected: "y".repeat(70_000) }] };
    expect((await verify(new CodeVerifier(wide), { task: longValue, answer: "function f() { return 'y'.repeat(70000); }" })).body).toMatchObject({ reward: 1 });
    const refusedCode = await verify(new CodeVerifier(LIMITS), { task: longValue, answer: "function f() { return 'y'.repeat(70000); }" });
    expect([refusedCode.status, refusedCode.body.error.code]).toEqual([400, "invalid_request"]);
    // A limits object without the per-case limit is a programming error, not "no limit".
    const { maxCaseOutputChars: _dropped, ...withoutLimit } = LIMITS;
    await expect(runSandboxed({ mode: "stdio", code: "print(1)", cases: [{ input: "" }] }, withoutLimit as typeof LIMITS)).rejects.toThrow(/maxCaseOutputChars/);
  });
});
