import type { KV } from "@nats-io/kv";
import { describe, expect, it } from "vitest";
import { WatchedMemberRegistry } from "../../../coordinator/membership/watched-member-registry.js";

interface RegistryInternals {
  lastRevision: number;
  streamCreated: string | undefined;
  generation: number;
  streamInfo(): Promise<{ created: string; lastSeq: number } | undefined>;
  checkStream(): Promise<void>;
}

// The check for a bucket deleted and created again compares the stream's last sequence with the
// highest revision the watch delivered. A heartbeat delivered while the stream info was in flight
// must not make a stale last sequence look like a stream that started over (seen in a chaos run:
// `membership_bucket_recreated {"last_revision":9,"stream_last_seq":8}`, the watch dropped).
describe("membership bucket re-creation check", () => {
  it("a revision the watch delivers while the stream info is in flight is not taken for a re-created bucket", async () => {
    const registry = new WatchedMemberRegistry({} as KV) as unknown as RegistryInternals;
    registry.lastRevision = 8;
    registry.streamCreated = "2026-12-05T00:00:00Z";
    let answer!: (info: { created: string; lastSeq: number }) => void;
    registry.streamInfo = () => new Promise((resolve) => (answer = resolve));
    const checking = registry.checkStream();
    registry.lastRevision = 9; // a heartbeat delivered meanwhile
    answer({ created: "2026-12-05T00:00:00Z", lastSeq: 8 });
    await checking;
    expect(registry.generation).toBe(0);
    expect(registry.lastRevision).toBe(9);
  });

  it("a last sequence below what the watch had delivered before the read is a re-created bucket", async () => {
    const registry = new WatchedMemberRegistry({} as KV) as unknown as RegistryInternals;
    registry.lastRevision = 9;
    registry.streamCreated = "2026-12-05T00:00:00Z";
    registry.streamInfo = async () => ({ created: "2026-12-05T00:00:00Z", lastSeq: 3 });
    await registry.checkStream();
    expect(registry.generation).toBe(1);
    expect(registry.lastRevision).toBe(0);
  });
});
