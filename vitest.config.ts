import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { configDefaults, defineConfig } from "vitest/config";

/**
 * Unit test files that keep a fresh process each, in the "isolated" project with integration and
 * e2e. First those that replace modules with vi.mock, which a worker shared between files cannot
 * honour: a module another file already imported keeps the real dependency, and the mock stays
 * registered for the files after it (the check below keeps this list complete).
 *
 * Every other file under test/unit runs in the "unit" project (isolate: false): each of its
 * workers runs file after file in one process with one module cache, so zod, nats.js and the
 * protocol modules load once per worker, not once per file. A file there restores what it changes
 * in the process, in an afterEach/afterAll of its own: process.env (in place), globals
 * (vi.unstubAllGlobals), fake timers (vi.useRealTimers), OpenTelemetry global providers
 * (trace/metrics/propagation/context.disable(), also after startTelemetry), process listeners,
 * process.exitCode.
 */
const ISOLATED_UNIT = [
  "test/unit/cli/collect-exit-owner.test.ts",
  "test/unit/cli/collect-unreadable-inputs.test.ts",
  "test/unit/cli/demo-flags.test.ts",
  "test/unit/collect/checkpoint-root-unreadable.test.ts",
  "test/unit/collect/collector-halt-bounded.test.ts",
  "test/unit/collect/collector-lock-aside-write-failure.test.ts",
  "test/unit/collect/collector-lock-takeover-race.test.ts",
  "test/unit/collect/collector-restore-failed-crash.test.ts",
  "test/unit/collect/collector-sigterm-all-done.test.ts",
  "test/unit/collect/dispatch-log-append-failure.test.ts",
  "test/unit/collect/dispatch-log-crash.test.ts",
  "test/unit/collect/dispatch-log-sync.test.ts",
  "test/unit/collect/records-after-results-sync.test.ts",
  "test/unit/collect/records-sink-abandon.test.ts",
  "test/unit/collect/records-sink-start-failures.test.ts",
  "test/unit/collect/results-append-cut-failure.test.ts",
  "test/unit/collect/results-append-failure.test.ts",
  "test/unit/collect/results-sync-failure.test.ts",
  "test/unit/collect/task-rows.test.ts",
  "test/unit/coordinator/abandoned-checkpoint-dir.test.ts",
  "test/unit/coordinator/checkpoint-dir-staging-race.test.ts",
  "test/unit/coordinator/checkpoint-directory-remade-fsync.test.ts",
  "test/unit/coordinator/checkpoint-root-created-durably.test.ts",
  "test/unit/coordinator/demo-abort.test.ts",
  "test/unit/coordinator/latest-repair-durable-manifest.test.ts",
  "test/unit/coordinator/prepare-unsearchable-root.test.ts",
  "test/unit/coordinator/publication.test.ts",
  "test/unit/coordinator/retention-cleanup-failure.test.ts",
  "test/unit/coordinator/retention-deposed-sweep.test.ts",
  "test/unit/coordinator/untaken-back-checkpoint-json.test.ts",
  "test/unit/model/after-commit-removal-race.test.ts",
  "test/unit/model/capture-ledger-index.test.ts",
  "test/unit/model/ledger-removal-durable.test.ts",
  "test/unit/model/ledger-removal-failure.test.ts",
  "test/unit/model/ledger-rewrite-dir-sync-failure.test.ts",
  "test/unit/model/striped-locks-clock-probes.test.ts",
  "test/unit/model/striped-locks-owner-write-failure.test.ts",
  "test/unit/model/striped-locks-release-failure.test.ts",
  "test/unit/model/striped-locks-takeover-race.test.ts",
  "test/unit/participants/checkpoint-dir-storage-refusal.test.ts",
  "test/unit/participants/commit-retry-failure-window.test.ts",
  "test/unit/participants/fs-storage-faults.test.ts",
  "test/unit/participants/fs-storage.test.ts",
  "test/unit/participants/membership-announcer.test.ts",
  "test/unit/participants/write-file-atomic.test.ts",
  "test/unit/protocol/subjects-version.test.ts",
  "test/unit/replay/checkpoint-seeds-storage.test.ts",
  "test/unit/replay/failed-reload-reuse.test.ts",
  "test/unit/replay/record-index-order.test.ts",
  "test/unit/replay/seeds-out.test.ts",
  "test/unit/replay/step-marker-unreadable.test.ts",
  "test/unit/replay/tasks-file-storage.test.ts",
  "test/unit/resources/sandbox-spawn-failure.test.ts",
  // Not mocks: these read module state that exists once per process, so they need it fresh.
  // coordinatorTelemetry() makes its tracer and instruments once, from the global providers of the
  // moment, and the files below check what they record under the providers they register.
  "test/unit/coordinator/http-trace.test.ts",
  "test/unit/coordinator/participant-client-outcome.test.ts",
  "test/unit/coordinator/telemetry.test.ts",
  "test/unit/telemetry/duration-buckets.test.ts",
  "test/unit/telemetry/duration-monotonic.test.ts",
  // listenForCheckpointSignals() installs the process's one SIGUSR1 listener and request queue;
  // the test checks that it adds exactly one listener and that a queue not yet served remembers.
  "test/unit/collect/checkpoint-requests.test.ts",
];

const ROOT = fileURLToPath(new URL(".", import.meta.url));
const UNIT = (readdirSync(join(ROOT, "test/unit"), { recursive: true }) as string[])
  .map((f) => `test/unit/${f.replaceAll("\\", "/")}`)
  .filter((f) => f.endsWith(".test.ts"));
const SHARED_UNIT = UNIT.filter((f) => !ISOLATED_UNIT.includes(f));

// A unit file that mocks modules but is missing above would run in a shared worker and leak its
// mocks: refuse to start instead.
const MOCKS = /\bvi\.(mock|doMock|unmock|doUnmock)\(/;
const unlisted = SHARED_UNIT.filter((f) => MOCKS.test(readFileSync(join(ROOT, f), "utf8")));
if (unlisted.length) throw new Error(`vitest.config.ts: add to ISOLATED_UNIT (they use vi.mock): ${unlisted.join(", ")}`);
const gone = ISOLATED_UNIT.filter((f) => !UNIT.includes(f));
if (gone.length) throw new Error(`vitest.config.ts: ISOLATED_UNIT names files that do not exist: ${gone.join(", ")}`);

// Integration and e2e tests spawn real nats-server and Gym processes; forks keep them isolated
// and two workers match the 2-core machines CI runs on (maxWorkers counts across both projects).
export default defineConfig({
  test: {
    // One TMPDIR per run, removed after it: nothing a test leaves under the system temp directory stays.
    globalSetup: ["test/support/run-tmpdir.ts"],
    pool: "forks",
    maxWorkers: 2,
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
