/**
 * The program the sandbox child runs (`node -e`), kept as source text so it needs no file on
 * disk. Protocol with the parent (run-sandboxed.ts): the child prints `ready`, reads one job line
 * from stdin, runs every case in a fresh `node:vm` context and prints one JSON line. The parent
 * keeps stdin open for the whole run, so its end means the parent is gone: the child exits at
 * the next case boundary.
 *
 * Every value the submission can reach is created inside its context: the context comes from a
 * null-prototype object (no `process`, `require` or host `Function`; that object, made here, is
 * the `this` of a global accessor read by bare name, so it must keep no prototype), and `import()` — in the
 * submission, in `eval` or in `Function` code — is rejected with an error made in that context
 * (this needs `--experimental-vm-modules`; without a callback Node rejects with a host-realm
 * error whose constructor leads to the host's `Function`).
 * Host-realm values still reach a submission that wants them (a stack overflow inside Node's own
 * stack-trace or import callback throws a host-realm RangeError): the parent runs this child with
 * --disallow-code-generation-from-strings and --frozen-intrinsics so that its realm is inert.
 *
 * No submission code runs outside the per-case timeout (one deadline across the case's three
 * runInContext calls): `displayErrors: false` stops Node from
 * reading the thrown value's `stack` (a getter, a Proxy trap or `Error.prepareStackTrace`),
 * `describe` reads a thrown value only through own data properties and never touches a Proxy,
 * and unhandled rejections are swallowed instead of being inspected by Node's default handler
 * (known gap: Node still reads such a promise's async-id symbol after the case, so a Proxy made its
 * prototype runs untimed until the parent's wall clock; docs/verifiers.md, Time).
 * The context keeps only an allowlist of plain ECMAScript globals (KEPT): everything else —
 * ArrayBuffer, typed arrays, SharedArrayBuffer, Atomics, WebAssembly, Intl (whose ICU objects,
 * Segmenter above all, hold copies of their strings off the V8 heap), WeakRef, and any global a
 * later V8 adds — is deleted before the submission runs, so the heap limit of the child bounds
 * what it can keep. The parent's resident-memory watch covers what stays reachable (ICU behind
 * String.prototype.normalize / localeCompare / toLocale*, all transient).
 */
export const SANDBOX_CHILD_SOURCE = String.raw`
"use strict";
const vm = require("node:vm");
const { types } = require("node:util");
const { isProxy } = types;

process.on("unhandledRejection", () => undefined);
let received = "";
let started = false;
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => {
  if (started) return;
  received += chunk;
  const newline = received.indexOf("\n");
  if (newline === -1) return;
  started = true;
  const job = JSON.parse(received.slice(0, newline));
  received = "";
  runCases(job);
});
// The parent holds stdin open until it has our results: its end means the parent died.
process.stdin.on("end", () => process.exit(3));
process.stdin.on("error", () => process.exit(3));
process.stdout.write("ready\n");

// The globals a submission keeps: plain ECMAScript whose values live on the V8 heap. Any other
// global of the context is deleted (an allowlist, so an allocator a later V8 adds is removed too).
const KEPT = ["Object", "Function", "Array", "Number", "parseFloat", "parseInt", "Infinity", "NaN", "undefined", "Boolean",
  "String", "Symbol", "Date", "Promise", "RegExp", "Error", "AggregateError", "EvalError", "RangeError", "ReferenceError",
  "SyntaxError", "TypeError", "URIError", "globalThis", "JSON", "Math", "Map", "BigInt", "Set", "WeakMap", "WeakSet",
  "Proxy", "Reflect", "decodeURI", "decodeURIComponent", "encodeURI", "encodeURIComponent", "escape", "unescape", "eval",
  "isFinite", "isNaN", "Iterator"];

// Made inside the running case's context before any submission code, so the rejection of an
// import() hands the submission nothing from the host realm.
let importDenied;
const denyImport = () => {
  throw importDenied;
};

// What print() keeps of a case's output: up to keep characters of it joined (-1: none, in function mode,
// where printed output is never read). Past that nothing more is kept, so printing is bounded by the
// output limit rather than by the heap (a run that printed more than its heap ended as memory_limit,
// every case lost, however much of it a function mode submission's debug logging was).
// own: in function mode, the function's name: the prelude keeps what the name holds before the
// submission runs, so a call that would reach the sandbox's own global (a task "implement parseInt"
// or "eval" that the submission did not define) fails instead of passing with the built-in.
function prelude(input, keep, own) {
  return [
    // A global that cannot be deleted fails every case (closed) rather than stay reachable.
    "{ const kept = new Set(" + JSON.stringify(KEPT) + ");",
    "  for (const name of Reflect.ownKeys(globalThis)) if (typeof name === 'string' && !kept.has(name) && !Reflect.deleteProperty(globalThis, name)) throw new Error('sandbox: cannot remove ' + name); }",
    "const __out = (() => { const lines = []; let chars = -1;",
    "  return { lines, get over() { return chars > " + keep + "; }, add(line) { chars += line.length + 1; if (chars <= " + keep + ") lines.push(line); } }; })();",
    "globalThis.print = (...parts) => { __out.add(parts.map(String).join(' ')); };",
    "globalThis.console = { log: globalThis.print };",
    "globalThis.input = " + JSON.stringify(input) + ";",
    "const __lines = globalThis.input.split('\\n'); let __line = 0;",
    "globalThis.readLine = () => (__line < __lines.length ? __lines[__line++] : undefined);",
    // A function's result as [JSON text, every object the text was made from] (the caller checks
    // those for internal slots JSON drops: a Map or a Promise reads as {}), or -2 when it holds NaN
    // or ±Infinity (written as null: a function answering 0/0 passed a case expecting null), or -4
    // when an array holds a function, a symbol or undefined (written as null). As a property's value
    // they are dropped, as JSON does (a factory's methods, an optional field); alone, nothing is written.
    // Made before the submission runs, from the intrinsics as they are then.
    "const __encode = ((stringify, isArray, define) => (value) => { let bad = 0; const objects = []; let count = 0;",
    "  const text = stringify(value, function (key, v) {",
    "    if (typeof v === 'number') { if (v - v !== 0 && bad === 0) bad = -2; }",
    "    else if ((typeof v === 'function' || typeof v === 'symbol' || v === undefined) && isArray(this)) { if (bad === 0) bad = -4; }",
    "    else if (typeof v === 'object' && v !== null) define(objects, count++, { __proto__: null, value: v, writable: true, enumerable: true, configurable: true });",
    "    return v; });",
    "  return bad !== 0 ? bad : [text, objects]; })(JSON.stringify, Array.isArray, Reflect.defineProperty);",
    own === undefined ? "" : "const __sandboxOwn = typeof " + own + " === 'undefined' ? undefined : " + own + ";",
    "new Error('import() is not available in the sandbox');",
  ].join("\n");
}

// Objects whose content lives in internal slots JSON.stringify never reads: each reads as {} (plus
// its own enumerable properties). Node's brand checks run no code of the object, whatever its
// prototype, constructor or toStringTag; a Proxy is read through its traps, like the submission meant.
const SLOTTED = [["isPromise", "a Promise"], ["isMap", "a Map"], ["isSet", "a Set"], ["isWeakMap", "a WeakMap"], ["isWeakSet", "a WeakSet"],
  ["isRegExp", "a RegExp"], ["isNativeError", "an Error"], ["isDate", "a Date without toJSON"], ["isSymbolObject", "a Symbol object"],
  ["isBigIntObject", "a BigInt object"], ["isGeneratorObject", "a generator"], ["isMapIterator", "an iterator"], ["isSetIterator", "an iterator"],
  ["isAnyArrayBuffer", "a buffer"], ["isArrayBufferView", "a typed array"]];
function slotted(value) {
  if (isProxy(value)) return undefined;
  for (const [test, what] of SLOTTED) if (types[test](value)) return what;
  return undefined;
}

function ownString(object, key) {
  const descriptor = Object.getOwnPropertyDescriptor(object, key);
  return descriptor && typeof descriptor.value === "string" ? descriptor.value : undefined;
}

/** Describes a thrown value without running any of its code (getters, traps, toString). */
function describe(error) {
  try {
    if (error === null || (typeof error !== "object" && typeof error !== "function")) return String(error).slice(0, 500);
    if (isProxy(error)) return "Error: a Proxy was thrown";
    if (ownString(error, "code") === "ERR_SCRIPT_EXECUTION_TIMEOUT") return "timeout";
    const proto = Object.getPrototypeOf(error);
    const name = (proto !== null && !isProxy(proto) && ownString(proto, "name")) || "Error";
    return (name + ": " + String(ownString(error, "message"))).slice(0, 500);
  } catch {
    return "Error: an unreadable value was thrown";
  }
}

function runCases(job) {
  let script;
  let compileError;
  try {
    script = new vm.Script(job.code, { filename: "submission.js", importModuleDynamically: denyImport });
  } catch (error) {
    compileError = describe(error);
  }
  const results = [];
  const next = () => {
    if (results.length === job.cases.length) {
      process.stdout.write(JSON.stringify({ results }) + "\n", () => process.exit(0));
      return;
    }
    const testCase = job.cases[results.length];
    results.push(compileError === undefined ? runCase(job, script, testCase) : { status: "error", error: compileError });
    // Between cases the event loop runs, so the end of stdin (the parent died) is noticed.
    setImmediate(next);
  };
  next();
}

function runCase(job, script, testCase) {
  const context = vm.createContext(Object.create(null), {
    codeGeneration: { strings: true, wasm: false },
    microtaskMode: "afterEvaluate",
    importModuleDynamically: denyImport,
  });
  // One deadline for the case: the prelude, the submission and the call (or output join, which
  // the submission may have replaced) share it, each getting what the earlier ones left.
  const deadline = performance.now() + job.case_timeout_ms;
  const options = () => {
    const left = Math.ceil(deadline - performance.now());
    if (left < 1) throw { code: "ERR_SCRIPT_EXECUTION_TIMEOUT" };
    return { timeout: left, displayErrors: false };
  };
  try {
    const stdio = job.mode === "stdio";
    importDenied = vm.runInContext(prelude(stdio ? testCase.input : "", stdio ? job.max_case_output_chars : -1, stdio ? undefined : job.function_name), context, options());
    script.runInContext(context, options());
    const tail = job.mode === "function"
      ? "(" + job.function_name + " === __sandboxOwn && __sandboxOwn !== undefined ? -3 : __encode(" + job.function_name + "(..." + testCase.args_source + ")))"
      : "__out.over ? -1 : __out.lines.join('\\n')";
    let output = vm.runInContext(tail, context, options());
    if (stdio && output === -1) return { status: "output_limit" };
    if (!stdio && output === -2) return { status: "error", error: "the function returned NaN or Infinity, which JSON cannot encode" };
    if (!stdio && output === -3) return { status: "error", error: job.function_name + " is the sandbox's own global: the submission does not define it" };
    if (!stdio && output === -4) return { status: "error", error: "the function returned an array holding a function, a symbol or undefined, which JSON cannot encode (it reads as null)" };
    if (!stdio && typeof output === "object" && output !== null) {
      // Own data properties of arrays __encode made: reading them runs no submission code.
      const objects = output[1];
      // Checked first, so the untimed walk below covers at most one object per two output characters.
      if (typeof output[0] === "string" && output[0].length > job.max_case_output_chars) return { status: "output_limit" };
      for (let index = 0; index < objects.length; index += 1) {
        const what = slotted(objects[index]);
        if (what !== undefined) return { status: "error", error: "the function returned " + what + ", which JSON cannot encode (it reads as {})" };
      }
      output = output[0];
    }
    if (typeof output !== "string") return { status: "error", error: "the function returned nothing JSON can encode" };
    // Never compare a cut output: a case that printed more than the limit fails as such.
    if (output.length > job.max_case_output_chars) return { status: "output_limit" };
    return { status: "ok", output };
  } catch (error) {
    const detail = describe(error);
    return detail === "timeout" ? { status: "timeout" } : { status: "error", error: detail };
  } finally {
    importDenied = undefined;
  }
}
`;
