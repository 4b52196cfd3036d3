import { afterEach, describe, expect, it, vi } from "vitest";

// The heartbeat's recovery logic in isolation (a fake KV manager): a put that fails drops the
// bucket handle, so the next beat creates the bucket again instead of failing forever.
const kvm = vi.hoisted(() => ({ creates: 0, puts: [] as string[], failNextPut: false }));
vi.mock("@nats-io/kv", () => ({
  Kvm: class {
    async create() {
      kvm.creates += 1;
      let revision = 0;
      const write = async (key: string) => {
        if (kvm.failNextPut) {
          kvm.failNextPut = false;
          throw new Error("stream not found");
        }
        kvm.puts.push(key);
        return ++revision;
      };
      return { get: async () => null, create: write, update: write, delete: async () => undefined };
    }
  },
}));

const { NoRespondersError } = await import("@nats-io/transport-node");
// The claim probes the participant's status subject first: nobody else answers.
const noResponders = { request: async (subject: string) => Promise.reject(new NoRespondersError(subject)) } as never;
const { MembershipAnnouncer } = await import("../../../participants/control-plane/membership-announcer.js");

afterEach(() => {
  vi.useRealTimers();
});

describe("membership heartbeat", () => {
  it("re-creates the members bucket after a failed beat (deleted bucket, NATS back without its store)", async () => {
    vi.useFakeTimers();
    const announcer = new MembershipAnnouncer(noResponders, "dep", "environment", "env0", "inc-1", undefined, 100);
    await announcer.start();
    expect([kvm.creates, kvm.puts.length]).toEqual([1, 1]);
    kvm.failNextPut = true; // the bucket was deleted
    await vi.advanceTimersByTimeAsync(100);
    expect(kvm.puts.length).toBe(1);
    await vi.advanceTimersByTimeAsync(100);
    expect(kvm.creates).toBe(2); // created again, and announced again
    expect(kvm.puts).toEqual(["environment.env0", "environment.env0"]);
    await announcer.stop();
  });
});
