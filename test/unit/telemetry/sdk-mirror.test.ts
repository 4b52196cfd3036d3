import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";

/**
 * coordinator/ and participants/ may not import each other, so the daemons' SDK bootstrap exists
 * twice. This keeps the two copies of `startTelemetry` identical, so a fix lands in both.
 */
function startTelemetrySource(path: string): string {
  const text = readFileSync(new URL(`../../../${path}`, import.meta.url), "utf8");
  const start = text.indexOf("export interface TelemetryOptions");
  const end = text.indexOf("\n}\n", text.indexOf("export async function startTelemetry")) + 3;
  expect(start).toBeGreaterThan(-1);
  return text.slice(start, end);
}

describe("telemetry SDK bootstrap", () => {
  it("is the same in the coordinator and the participants", () => {
    const coordinator = startTelemetrySource("coordinator/telemetry/telemetry-sdk.ts");
    const participants = startTelemetrySource("participants/telemetry/telemetry-sdk.ts");
    expect(coordinator.length).toBeGreaterThan(1000);
    expect(coordinator).toBe(participants);
  });
});
