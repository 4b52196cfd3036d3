import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { configDefaults, defineConfig } from "vitest/config";

/**
 * Unit test files keep a fresh process each, in the "isolated" project with integration and e2e,
 * when they replace modules (vi.mock and kin): a worker shared between files cannot honour that, as
 * a module another file already imported keeps the real dependency, and the mock stays registered
 * for the files after it. Or when they are listed in FRESH_STATE_UNIT.
 *
 * Every other file under test/unit runs in the "unit" project (isolate: false): each of its
 * workers runs file after file in one process with one module cache, so zod, nats.js and the
 * protocol modules load once per worker, not once per file. A file there restores what it changes
 * in the process, in an afterEach/afterAll of its own: process.env (in place), globals
 * (vi.unstubAllGlobals), fake timers (vi.useRealTimers), OpenTelemetry global providers and
 * OTEL_* variables (test/support/otel-globals.ts, also after startTelemetry), process listeners,
 * process.exitCode.
 */
const MOCKS = /\bvi\.(mock|doMock|unmock|doUnmock)\(/;

/**
 * Not mocks: these read module state that exists once per process, so they need it fresh.
 * coordinatorTelemetry() makes its tracer and instruments once, from the global providers of the
 * moment, and the first five check what they record under the providers they register.
 * listenForCheckpointSignals() installs the process's one SIGUSR1 listener and request queue; the
 * last checks that it adds exactly one listener and that a queue not yet served remembers.
 */
const FRESH_STATE_UNIT = [
  "test/unit/coordinator/http-trace.test.ts",
  "test/unit/coordinator/participant-client-outcome.test.ts",
  "test/unit/coordinator/telemetry.test.ts",
  "test/unit/telemetry/duration-buckets.test.ts",
  "test/unit/telemetry/duration-monotonic.test.ts",
  "test/unit/collect/checkpoint-requests.test.ts",
];

const ROOT = fileURLToPath(new URL(".", import.meta.url));
const UNIT = (readdirSync(join(ROOT, "test/unit"), { recursive: true }) as string[])
  .map((f) => `test/unit/${f.replaceAll("\\", "/")}`)
  .filter((f) => f.endsWith(".test.ts"));
const gone = FRESH_STATE_UNIT.filter((f) => !UNIT.includes(f));
if (gone.length) throw new Error(`vitest.config.ts: FRESH_STATE_UNIT names files that do not exist: ${gone.join(", ")}`);
const SHARED_UNIT = UNIT.filter((f) => !FRESH_STATE_UNIT.includes(f) && !MOCKS.test(readFileSync(join(ROOT, f), "utf8")));

// Integration and e2e tests spawn real nats-server and Gym processes; forks keep them isolated.
// Three workers on the 2-core machines CI runs on (maxWorkers counts across both projects): with
// two, the cores were often idle while tests waited on their servers and timers (one 2-core
// machine, two workers: `vitest run test/integration` kept 1.1 cores busy, the unit project 1.3).
// Measured there: the fresh-clone .ci/run 1036 s with two workers, 857 s with three;
// test/integration alone 216 → 180 s, the unit project alone 128 → 115 s.
export default defineConfig({
  test: {
    // One TMPDIR per run, removed after it: nothing a test leaves under the system temp directory stays.
    globalSetup: ["test/support/run-tmpdir.ts"],
    pool: "forks",
    maxWorkers: 3,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    teardownTimeout: 30_000,
    projects: [
      // Every test file but SHARED_UNIT: a fresh process per file, as before.
      { extends: true, test: { name: "isolated", include: ["test/**/*.test.ts"], exclude: [...configDefaults.exclude, ...SHARED_UNIT] } },
      { extends: true, test: { name: "unit", include: SHARED_UNIT, isolate: false } },
    ],
  },
});
