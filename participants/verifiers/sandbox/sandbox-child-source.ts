/**
 * The program the sandbox child runs (`node -e`), kept as source text so it needs no file on
 * disk. It reads one job from stdin, runs every case in a fresh `node:vm` context created from a
 * null-prototype object (so no host object — `process`, `require`, host `Function` — is
 * reachable), with a per-case timeout that also covers microtasks, and prints one JSON line.
 * Off-heap allocators (ArrayBuffer, typed arrays, WebAssembly) are removed from the context so
 * the heap limit of the child bounds memory.
 */
export const SANDBOX_CHILD_SOURCE = String.raw`
"use strict";
const vm = require("node:vm");
const chunks = [];
process.stdin.on("data", (chunk) => chunks.push(chunk));
process.stdin.on("end", () => {
  const job = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  const results = job.cases.map((testCase) => runCase(job, testCase));
  process.stdout.write(JSON.stringify({ results }) + "\n");
});

const REMOVED = ["ArrayBuffer", "SharedArrayBuffer", "DataView", "Atomics", "WebAssembly", "Int8Array", "Uint8Array",
  "Uint8ClampedArray", "Int16Array", "Uint16Array", "Int32Array", "Uint32Array", "Float32Array", "Float64Array",
  "BigInt64Array", "BigUint64Array", "FinalizationRegistry", "WeakRef"];

function prelude(input) {
  return [
    "for (const name of " + JSON.stringify(REMOVED) + ") delete globalThis[name];",
    "const __out = [];",
    "globalThis.print = (...parts) => { __out.push(parts.map(String).join(' ')); };",
    "globalThis.console = { log: globalThis.print };",
    "globalThis.input = " + JSON.stringify(input) + ";",
    "const __lines = globalThis.input.split('\\n'); let __line = 0;",
    "globalThis.readLine = () => (__line < __lines.length ? __lines[__line++] : undefined);",
  ].join("\n");
}

function describe(error) {
  if (error === null || typeof error !== "object") return String(error).slice(0, 500);
  if (error.code === "ERR_SCRIPT_EXECUTION_TIMEOUT") return "timeout";
  const message = Object.getOwnPropertyDescriptor(error, "message");
  const name = Object.getOwnPropertyDescriptor(Object.getPrototypeOf(error) || {}, "name");
  return (String(name && name.value || "Error") + ": " + String(message && message.value)).slice(0, 500);
}

function runCase(job, testCase) {
  const context = vm.createContext(Object.create(null), { codeGeneration: { strings: true, wasm: false }, microtaskMode: "afterEvaluate" });
  const options = { timeout: job.case_timeout_ms };
  try {
    vm.runInContext(prelude(job.mode === "stdio" ? testCase.input : ""), context, options);
    vm.runInContext(job.code, context, options);
    const tail = job.mode === "function"
      ? "JSON.stringify(" + job.function_name + "(..." + JSON.stringify(testCase.args) + "))"
      : "__out.join('\\n')";
    const output = vm.runInContext(tail, context, options);
    if (typeof output !== "string") return { status: "error", error: "the function returned nothing JSON can encode" };
    return { status: "ok", output: output.slice(0, 65536) };
  } catch (error) {
    const detail = describe(error);
    return detail === "timeout" ? { status: "timeout" } : { status: "error", error: detail };
  }
}
`;
