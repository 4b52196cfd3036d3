import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { collectorIn, idleController } from "../../support/collector-fixture.js";

/**
 * A finished row is appended to `--out`, then its rollout record is buffered and published in a
 * step file, durably. `--out` must be on disk before that step is: after a power loss that kept
 * the step but lost the row's results line, the next start would run the row again and record it a
 * second time (the records are training data: a row read twice).
 */
const events = vi.hoisted(() => [] as string[]);

vi.mock("node:fs/promises", async (importOriginal) => {
  const { handleWith, withOverrides } = await import("../../support/fs-mock.js");
  const real = await importOriginal<typeof import("node:fs/promises")>();
  const open: typeof real.open = async (path, flags, mode) => {
    const handle = await real.open(path, flags, mode);
    const name = basename(String(path));
    const synced = (sync: () => Promise<void>) => async () => {
      await sync();
      events.push(`sync ${name}`);
    };
    return handleWith(handle, { sync: synced(() => handle.sync()), datasync: synced(() => handle.datasync()) });
  };
  const link: typeof real.link = async (existing, target) => {
    await real.link(existing, target);
    events.push(`link ${basename(String(target))}`);
  };
  const appendFile: typeof real.appendFile = async (path, data, options) => {
    await real.appendFile(path, data, options);
    events.push(`append ${basename(String(path))}`);
  };
  return withOverrides(real, { open, link, appendFile });
});

let dir: string;
let server: Server | undefined;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-records-sync-"));
  events.length = 0;
});
afterEach(async () => {
  server?.closeAllConnections();
  server?.close();
  server = undefined;
  await rm(dir, { recursive: true, force: true });
});

const trajectory = { task_name: null, prompt: null, nodes: [], reward: 1, turns: 0, stop_condition: null, is_completed: true, replay: null };

describe("collector rollout records", () => {
  it("a row's record is published only once its results line is on disk (synced), so a power loss cannot keep the record and lose the row", async () => {
    server = createServer((req, res) => {
      req.resume();
      req.on("end", () => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1, trajectory })));
    });
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const collector = collectorIn(dir, `http://127.0.0.1:${(server.address() as { port: number }).port}/run`, idleController(), {
      records: { dir: join(dir, "records"), env: "gym", kind: "eval", everyRows: 1, everySeconds: 600 },
    });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 1, records: { records: 1, steps: 1 } });
    const appended = events.indexOf("append results.jsonl");
    const published = events.indexOf("link eval_rollouts_gym.jsonl");
    expect(appended).toBeGreaterThanOrEqual(0);
    expect(published).toBeGreaterThan(appended);
    expect(events.slice(appended, published)).toContain("sync results.jsonl");
  });
});
