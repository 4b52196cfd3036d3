import { describe, expect, it, vi } from "vitest";

// The subjects carry the protocol version (gym.ckpt.v<N>.…) so processes of two versions never
// answer each other: the root must follow PROTOCOL_VERSION, not a literal that a bump leaves behind.
vi.mock("../../../protocol/version.js", async (importOriginal) => ({ ...(await importOriginal<object>()), PROTOCOL_VERSION: 7 }));

describe("subject root", () => {
  it("names PROTOCOL_VERSION", async () => {
    const { participantSubject, controllerSubject } = await import("../../../protocol/subjects.js");
    expect(participantSubject("dep", "agent", "a1", "prepare")).toBe("gym.ckpt.v7.dep.p.agent.a1.prepare");
    expect(controllerSubject("dep", "status")).toBe("gym.ckpt.v7.dep.ctl.status");
  });
});
