import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { DispatchLog } from "../../../coordinator/collect/dispatch-log.js";
import { readResults } from "../../../coordinator/collect/results-file.js";
import { CheckpointError, sha256Hex, type EpisodeId } from "../../../protocol/index.js";
import { collectorIn, idleController } from "../../support/collector-fixture.js";

/**
 * A collector killed while logging the replacements of a restore whose outcome stayed unknown
 * (restore_failed's path): simulated as the process dying halfway through its next data write
 * under the checkpoint root, as in dispatch-log-crash.test.ts. The next start must find every row
 * at one attempt, so that it neither restores the rows not yet logged again with a smaller scope
 * (which the restore left open refuses, leaving it open) nor loses or duplicates a row.
 */
const crash = vi.hoisted(() => ({ under: undefined as string | undefined }));

vi.mock("node:fs/promises", async (importOriginal) => {
  const { handleWith, withOverrides } = await import("../../support/fs-mock.js");
  const real = await importOriginal<typeof import("node:fs/promises")>();
  const armed = (path: unknown) => crash.under !== undefined && String(path).startsWith(crash.under);
  const half = (data: unknown) => (typeof data === "string" ? data.slice(0, data.length / 2) : (data as Uint8Array).subarray(0, (data as Uint8Array).byteLength / 2));
  const open: typeof real.open = async (path, flags, mode) => {
    const handle = await real.open(path, flags, mode);
    if (!armed(path)) return handle;
    const crashing = (write: (data: string) => Promise<void>) => async (data: string | Uint8Array) => {
      await write(half(data) as string);
      throw new Error("simulated crash mid-write");
    };
    return handleWith(handle, { writeFile: crashing((data) => handle.writeFile(data)), appendFile: crashing((data) => handle.appendFile(data)) });
  };
  return withOverrides(real, { open });
});

let dir: string;
let server: Server | undefined;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-restore-crash-"));
});
afterEach(async () => {
  crash.under = undefined;
  server?.closeAllConnections();
  server?.close();
  server = undefined;
  await rm(dir, { recursive: true, force: true });
});

const checkpointId = "ckpt-20240101T000000-aaaaaaaa";
const sources: EpisodeId[] = [
  { rollout_id: "a", attempt: 0 },
  { rollout_id: "b", attempt: 0 },
];

describe("collector killed after a failed restore", () => {
  it("while logging the replacements: the next start neither restores the rest with a smaller scope nor leaves the restore open, and each row finishes once", { timeout: 20_000 }, async () => {
    // run-1 dispatched a@0 and b@0 and crashed after a checkpoint continuing both.
    await DispatchLog.create(join(dir, "dispatched.jsonl"), "run-1", sources);
    await mkdir(join(dir, checkpointId));
    const text = `${JSON.stringify({ checkpoint_id: checkpointId, run_id: "run-1", created_at: 1, continued: sources, restarted: [] })}\n`;
    await writeFile(join(dir, checkpointId, "collection.json"), text);
    // A coordinator whose successor keeps the restore that landed open (restored) for its controller:
    // a retry with the same scope gets its reply; any other restore is refused while it is open.
    let open: { scope: string } | null = null;
    let lost = 0;
    const restores: unknown[] = [];
    const controller = idleController({
      list: async () => ({ latest: checkpointId, checkpoints: [] }),
      get: async () => ({ latest: true, manifest: { controller_state: { file: "collection.json", sha256: sha256Hex(text) } } }),
      status: async () => ({ checkpoint: open && { checkpoint_id: checkpointId, phase: "restored" }, participants: [] }),
      restore: async (req: { episode_ids: EpisodeId[] }) => {
        restores.push(req.episode_ids);
        const scope = JSON.stringify(req.episode_ids);
        if (open && open.scope !== scope) throw new CheckpointError("invalid_phase", `checkpoint ${checkpointId} is open (restored); resume it before a restore`);
        open = { scope };
        // The first start's three tries all lose their reply; the process dies at its next write.
        if (lost < 3) {
          if (++lost === 3) crash.under = dir;
          throw new CheckpointError("outcome_unknown", "no reply");
        }
        return { checkpoint_id: checkpointId, participants: [] };
      },
      resume: async () => ((open = null), {}),
    });
    const sent: string[] = [];
    server = createServer((req, res) => {
      let data = "";
      req.on("data", (chunk: Buffer) => (data += chunk.toString()));
      req.on("end", () => {
        const body = JSON.parse(data) as { rollout_id: string; attempt: number };
        sent.push(`${body.rollout_id}@${body.attempt}`);
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify({ reward: 1 }));
      });
    });
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}/run`;
    const rows = sources.map((s) => ({ rolloutId: s.rollout_id, task: {} }));

    const first = collectorIn(dir, url, controller, { rows });
    await expect(first.start()).rejects.toThrow("simulated crash");
    await first.halt(); // the process is gone: its background resend of the resume with it
    crash.under = undefined;

    restores.length = 0;
    const next = collectorIn(dir, url, controller, { rows });
    await next.start();
    // The log still names both rows at their source attempts: the same restore again, answered with its reply.
    expect(restores).toEqual([sources]);
    expect(open).toBeNull(); // resumed: not left parked until the participants' lease
    expect(await next.run()).toMatchObject({ finished: 2, failed: 0, continued: 2 });
    expect(sent.sort()).toEqual(["a@1", "b@1"]);
    expect([...(await readResults(join(dir, "results.jsonl"))).keys()].sort()).toEqual(["a", "b"]);
  });
});
