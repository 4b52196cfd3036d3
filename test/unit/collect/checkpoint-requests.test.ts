import { describe, expect, it } from "vitest";
import { CheckpointRequests, listenForCheckpointSignals } from "../../../coordinator/collect/checkpoint-requests.js";

describe("checkpoint requests (SIGUSR1)", () => {
  it("requests before serve run as one checkpoint when served; later ones each run at once", () => {
    const requests = new CheckpointRequests();
    let checkpoints = 0;
    requests.request();
    requests.request();
    requests.request();
    requests.serve(() => checkpoints++);
    expect(checkpoints).toBe(1);
    requests.request();
    requests.request();
    expect(checkpoints).toBe(3);
  });

  it("without a request before serve, serving runs nothing", () => {
    const requests = new CheckpointRequests();
    let checkpoints = 0;
    requests.serve(() => checkpoints++);
    expect(checkpoints).toBe(0);
  });
});

describe("SIGUSR1 listener", () => {
  it("is installed once however often asked for, and a signal before serve is remembered", () => {
    const before = process.listeners("SIGUSR1");
    try {
      const requests = listenForCheckpointSignals();
      expect(listenForCheckpointSignals()).toBe(requests);
      const added = process.listeners("SIGUSR1").filter((l) => !before.includes(l));
      expect(added).toHaveLength(1);
      process.emit("SIGUSR1", "SIGUSR1");
      let checkpoints = 0;
      requests.serve(() => checkpoints++);
      expect(checkpoints).toBe(1);
      process.emit("SIGUSR1", "SIGUSR1");
      expect(checkpoints).toBe(2);
    } finally {
      for (const l of process.listeners("SIGUSR1")) if (!before.includes(l)) process.off("SIGUSR1", l as () => void);
    }
  });
});
