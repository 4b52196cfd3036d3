import { vi } from "vitest";

/**
 * What a controller client's call settles to (`"answered"` or its error code) when the wall clock
 * steps an hour back just after the call began (NTP, a VM resume), or `"still asking"` after 5 s:
 * a wait timed on Date.now() would then run for the step's length, not its own bound.
 */
export async function outcomeAcrossWallStepBack(call: () => Promise<unknown>): Promise<unknown> {
  const wall = Date.now.bind(Date);
  const stepped = vi.spyOn(Date, "now");
  try {
    const asking = call().then(
      () => "answered",
      (error: { code?: string }) => error.code,
    );
    stepped.mockImplementation(() => wall() - 3_600_000);
    return await Promise.race([asking, new Promise((resolve) => setTimeout(() => resolve("still asking"), 5_000).unref())]);
  } finally {
    stepped.mockRestore();
  }
}
