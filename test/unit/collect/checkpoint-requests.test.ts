import { describe, expect, it } from "vitest";
import { CheckpointRequests } from "../../../coordinator/collect/checkpoint-requests.js";

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
