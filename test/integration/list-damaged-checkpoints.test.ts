import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HttpControllerClient } from "../../coordinator/client/http-controller-client.js";
import { CONTROLLER_TOKEN, startWorld, type World } from "./coordinator-harness.js";

let world: World;
let http: HttpControllerClient;
beforeAll(async () => {
  world = await startWorld();
  const coordinator = await world.startCoordinator({ lease_ms: 3000 });
  await coordinator.whenReady();
  http = new HttpControllerClient({ baseUrl: coordinator.httpUrl!, token: CONTROLLER_TOKEN });
});
afterAll(async () => {
  await world?.close();
});

describe("list names the damaged checkpoints, as gym-ckpt ls --json does", () => {
  it("a checkpoint directory whose checkpoint.json does not parse is named with its code and detail, over HTTP and NATS", async () => {
    await mkdir(join(world.root, "c-bad"));
    await writeFile(join(world.root, "c-bad", "checkpoint.json"), "{not json");
    for (const [api, client] of [
      ["http", http],
      ["nats", world.client],
    ] as const) {
      const listed = await client.list();
      expect([api, listed]).toEqual([
        api,
        {
          latest: null,
          checkpoints: [],
          damaged: [{ checkpoint_id: "c-bad", code: "invalid_checkpoint_state", detail: expect.stringContaining("checkpoint.json") }],
        },
      ]);
    }
  });
});
