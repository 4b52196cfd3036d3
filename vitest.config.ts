import { defineConfig } from "vitest/config";

// Integration and e2e tests spawn real nats-server and Gym processes; forks keep them isolated
// and two workers match the 2-core machines CI runs on.
export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // One TMPDIR per run, removed after it: nothing a test leaves under the system temp directory stays.
    globalSetup: ["test/support/run-tmpdir.ts"],
    pool: "forks",
    maxWorkers: 2,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    teardownTimeout: 30_000,
  },
});
