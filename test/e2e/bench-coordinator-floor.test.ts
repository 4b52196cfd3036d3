import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import type { Msg } from "@nats-io/transport-node";
import { afterAll, beforeAll, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { ensureBuilt } from "./coordinator-process.js";

/**
 * docs/benchmarks.md compares a checkpoint with a floor of bare requests in "the same staged
 * pattern". Both are sniffed on the wire here, from the built benchmark (its responders run the
 * module file in a child process): every prepare, commit and resume of the floor must carry the
 * same body fields, the same headers and a reply subject under the same prefix as the engine's, so
 * the ratio compares the coordinator's work, not smaller messages.
 */
type Bench = typeof import("../../bench/coordinator-checkpoint.js");

let nats: NatsFixture;
let root: string;

beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "bench-floor-"));
});
afterAll(async () => {
  await nats?.close();
  if (root) await rm(root, { recursive: true, force: true });
});

interface Seen {
  op: string;
  fields: string[];
  bytes: number;
  headers: string[];
  headerBytes: number;
  replyPrefix: string;
}

it("the floor's messages are the checkpoint's, field for field", async () => {
  const bench = (await import(pathToFileURL(resolve("dist/bench/coordinator-checkpoint.js")).href)) as Bench;
  const deployment = "benchfloor";
  const world = await bench.startWorld(nats.server.url, join(root, "ckpt"), deployment, 4);
  try {
    let side: "checkpoint" | "floor" = "checkpoint";
    const seen: Record<"checkpoint" | "floor", Seen[]> = { checkpoint: [], floor: [] };
    const sniffer = nats.nc.subscribe(">", {
      callback: (_err, msg: Msg) => {
        const op = msg.subject.split(".").at(-1)!;
        if (!msg.subject.includes(`.${deployment}.p.`) || !["prepare", "commit", "resume"].includes(op)) return;
        const headers = msg.headers ? [...msg.headers.keys()].sort() : [];
        seen[side].push({
          op,
          fields: Object.keys(msg.json() as object),
          bytes: msg.data.byteLength,
          headers,
          headerBytes: headers.reduce((sum, k) => sum + k.length + msg.headers!.get(k).length, 0),
          replyPrefix: msg.reply!.split(".")[0]!,
        });
      },
    });
    await nats.nc.flush();
    // Same-length ids, so that equal messages have equal sizes.
    const reply = await world.client.checkpoint({ checkpoint_id: "c-1" });
    expect(reply.participants).toBe(4);
    await nats.nc.flush();
    side = "floor";
    await bench.floorRound(world, "f-1");
    await nats.nc.flush();
    sniffer.unsubscribe();

    expect(seen.checkpoint.map((s) => s.op)).toEqual(seen.floor.map((s) => s.op));
    expect(seen.floor).toHaveLength(12); // 4 prepares, 4 commits, 4 resumes
    for (const [i, c] of seen.checkpoint.entries()) {
      const f = seen.floor[i]!;
      expect({ op: f.op, fields: f.fields, headers: f.headers, replyPrefix: f.replyPrefix }).toEqual({ op: c.op, fields: c.fields, headers: c.headers, replyPrefix: c.replyPrefix });
      // A deadline's or a send time's digits may differ by one or two.
      expect(Math.abs(f.bytes - c.bytes), `${c.op} body: ${c.bytes} B, floor ${f.bytes} B`).toBeLessThanOrEqual(3);
      expect(Math.abs(f.headerBytes - c.headerBytes), `${c.op} headers`).toBeLessThanOrEqual(3);
    }
  } finally {
    await world.close();
  }
});
