import { afterEach, describe, expect, it, vi } from "vitest";

/**
 * The replay library's fallback logger (a ReplayTaskSource or readRecords given no logger) takes
 * its level from LOG_LEVEL, a variable many other programs read too. A value pino does not know
 * (Python's `warning`, an empty `LOG_LEVEL=`) made pino throw, so `new ReplayTaskSource(...)` and
 * `readRecords` failed in any process that set it: "default level:warning must be included in
 * custom levels". Such a value now leaves the default (info); `warning` means warn.
 */
const saved = process.env.LOG_LEVEL;
afterEach(() => {
  if (saved === undefined) delete process.env.LOG_LEVEL;
  else process.env.LOG_LEVEL = saved;
});

/** A fresh copy of the module: the fallback logger is created once per process. */
async function levelWith(value: string | undefined): Promise<string> {
  if (value === undefined) delete process.env.LOG_LEVEL;
  else process.env.LOG_LEVEL = value;
  vi.resetModules();
  const { defaultLogger } = await import("../../../participants/replay/log.js");
  return defaultLogger().level;
}

describe("replay fallback logger: LOG_LEVEL", () => {
  it.each([
    [undefined, "info"],
    ["", "info"],
    ["  ", "info"],
    ["warning", "warn"],
    ["WARNING", "warn"],
    ["Debug", "debug"],
    ["error", "error"],
    ["silent", "silent"],
    ["verbose", "info"],
    ["10", "info"],
  ])("LOG_LEVEL=%j: %s, no throw", async (value, level) => {
    expect(await levelWith(value)).toBe(level);
  });
});
