import type { Status } from "@nats-io/transport-node";
import { describe, expect, it } from "vitest";
import { logNatsStatus } from "../../../protocol/nats-status-log.js";

async function* statuses(list: Status[]): AsyncIterable<Status> {
  yield* list;
}

describe("logNatsStatus", () => {
  it("a long outage is one warning and one info line: its reconnect attempts, and a disconnect seen again, are debug", async () => {
    const lines: { level: string; msg: string; fields: Record<string, unknown> }[] = [];
    const log = {
      warn: (fields: object, msg: string) => void lines.push({ level: "warn", msg, fields: fields as Record<string, unknown> }),
      info: (fields: object, msg: string) => void lines.push({ level: "info", msg, fields: fields as Record<string, unknown> }),
      debug: (fields: object, msg: string) => void lines.push({ level: "debug", msg, fields: fields as Record<string, unknown> }),
    };
    let clock = 0;
    const reconnecting = Array.from({ length: 100 }, () => ({ type: "reconnecting" }) as Status);
    await logNatsStatus(
      statuses([{ type: "disconnect", server: "127.0.0.1:4222" }, ...reconnecting, { type: "disconnect", server: "127.0.0.1:4223" }, { type: "reconnect", server: "127.0.0.1:4222" }]),
      log,
      () => false,
      () => (clock += 100),
    );
    expect(lines.filter((l) => l.level !== "debug")).toEqual([
      { level: "warn", msg: "nats_disconnected", fields: { server: "127.0.0.1:4222", reconnect_attempts_logged_at: "debug" } },
      { level: "info", msg: "nats_reconnected", fields: { server: "127.0.0.1:4222", down_s: 0.1, reconnect_attempts: 100 } },
    ]);
    expect(lines.filter((l) => l.level === "debug")).toHaveLength(101);
  });
});
