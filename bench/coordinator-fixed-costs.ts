import { mkdtemp, rm } from "node:fs/promises";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { MANIFEST_SCHEMA_VERSION } from "../protocol/index.js";
import { KvDecisionJournal } from "../coordinator/ha/decision-journal.js";
import { NatsServerProcess } from "../coordinator/local/nats-server-process.js";
import { GlobalManifestWriter, type PublishInput } from "../coordinator/publication/global-manifest-writer.js";
import { machine, percentile, writeSection } from "./bench-report.js";
import { assertAllTookPart, checkpointRound, floorRound, startWorld, type World } from "./coordinator-checkpoint.js";

/**
 * Where the coordinator's ratio to the request floor goes at a small size: the same interleaved
 * checkpoint-and-floor rounds as the coordinator benchmark, repeated with the fixed per-checkpoint
 * costs taken out one by one (stubbed in this process). The stubbed variants are measurements, never
 * configurations: without the journal a successor could not complete a decision, and without the
 * publication nothing would be restorable.
 */
const N = Number(process.env.COORD_FIXED_COSTS_N ?? 4);
const ROUNDS = 300;
const WARMUP = 15;

interface Variant {
  name: string;
  /** Takes the costs out; returns what puts them back. */
  stub(): () => void;
  /** The checkpoint op called on the engine in this process, not sent over NATS by the controller client. */
  direct?: boolean;
}

/** Replaces methods on a prototype; returns what restores them. */
function replaceMethods<T extends object>(proto: T, replacements: Partial<Record<keyof T, unknown>>): () => void {
  const saved = Object.fromEntries(Object.keys(replacements).map((k) => [k, proto[k as keyof T]]));
  Object.assign(proto, replacements);
  return () => Object.assign(proto, saved);
}

/** No checkpoint directory, no LATEST, no checkpoint.json, no retention: a manifest in memory only. */
function stubPublication(): () => void {
  return replaceMethods(GlobalManifestWriter.prototype, {
    stage() {},
    async checkpointDirectory() {},
    async publish(input: PublishInput) {
      const { checkpointId, epoch, preparedAt, publishedAt, stop, scope, restarts, participants } = input;
      const manifest = { schema_version: MANIFEST_SCHEMA_VERSION, checkpoint_id: checkpointId, epoch, prepared_at: preparedAt, published_at: publishedAt, stop, scope, restarts, participants, controller_state: null };
      return { manifestPath: "(not written)", manifest };
    },
    retain: () => [],
    durable: async () => {},
  });
}

/** No KV writes for the journal entry and the commit decision. */
function stubJournal(): () => void {
  return replaceMethods(KvDecisionJournal.prototype, { async record() {}, async remove() {} });
}

const both = () => {
  const restores = [stubPublication(), stubJournal()];
  return () => restores.forEach((restore) => restore());
};

const VARIANTS: Variant[] = [
  { name: "the full checkpoint (as shipped)", stub: () => () => {} },
  { name: "without the durable publication", stub: stubPublication },
  { name: "without the publication and the journal's KV writes", stub: both },
  { name: "as above, and without the controller hop (the engine called in process)", stub: both, direct: true },
];

async function measure(world: World, variant: Variant, index: number): Promise<{ p50: number; f50: number }> {
  const restore = variant.stub();
  const checkpoints: number[] = [];
  const floors: number[] = [];
  try {
    for (let i = 0; i < ROUNDS + WARMUP; i++) {
      const id = `fixed-${index}-${i}`;
      let t = performance.now();
      if (variant.direct) assertAllTookPart(world, await world.coordinator.engine.checkpoint({ checkpoint_id: id, episode_ids: null, stop: false, controller_state: null }));
      else await checkpointRound(world, id);
      const a = performance.now() - t;
      t = performance.now();
      await floorRound(world, `floor-${id}`);
      const b = performance.now() - t;
      if (i >= WARMUP) {
        checkpoints.push(a);
        floors.push(b);
      }
    }
  } finally {
    restore();
  }
  return { p50: percentile(checkpoints, 50), f50: percentile(floors, 50) };
}

/** What each cost adds (the difference between consecutive rows), against what the 1.5× target leaves. */
function summary(ratios: number[]): string {
  const [full, noPublication, noJournal, engine] = ratios as [number, number, number, number];
  const x = (v: number) => `${v.toFixed(2)}×`;
  return `What each cost adds, in multiples of the floor: the durable publication (its file calls and fsyncs, beside the resume on 2 cores) ${x(full - noPublication)}, the journal's acknowledged KV writes ${x(noPublication - noJournal)}, the controller hop (the request and reply over NATS, the API's decoding and checks) ${x(noJournal - engine)}; the engine alone runs at ${x(engine)} the floor. The 1.5× target leaves 0.50× over the floor for all of them together.`;
}

export async function run(): Promise<void> {
  const server = await NatsServerProcess.start();
  const root = await mkdtemp(join(tmpdir(), "gym-ckpt-bench-fixed-"));
  const rows: string[] = [];
  const ratios: number[] = [];
  try {
    const world = await startWorld(server.url, join(root, "fixed"), "fixed", N);
    try {
      for (const [index, variant] of VARIANTS.entries()) {
        const { p50, f50 } = await measure(world, variant, index);
        const ratio = p50 / f50;
        ratios.push(ratio);
        console.log(`${variant.name}: checkpoint p50 ${p50.toFixed(2)} ms | floor p50 ${f50.toFixed(2)} ms | ratio ${ratio.toFixed(2)}×`);
        rows.push(`| ${variant.name} | ${p50.toFixed(2)} | ${f50.toFixed(2)} | ${ratio.toFixed(2)}× |`);
      }
    } finally {
      await world.close();
    }
  } finally {
    await server.dispose();
    await rm(root, { recursive: true, force: true });
  }
  await writeSection(
    "coordinator-fixed-costs",
    `## Coordinator: where the ratio goes at ${N} participants

Machine: ${machine()}. Command: \`npm run bench -- coordinator-fixed-costs\` (size via \`COORD_FIXED_COSTS_N\`). nats-server 2.9 on 127.0.0.1; load average ${loadavg()[0]!.toFixed(1)} at the end of the run.
The coordinator benchmark's rounds (a checkpoint through the controller API, then the floor's staged requests, interleaved; ${ROUNDS} rounds after ${WARMUP} warm-up) against the same daemon and responders, repeated with the fixed per-checkpoint costs taken out one by one: the methods that do them are replaced in this process for the variant's rounds. Each ratio is to the floor measured in the same rounds. The stubbed variants are measurements only: without the journal a successor could not complete a commit decision, and without the publication nothing could be restored.

| variant | checkpoint p50 (ms) | floor p50 (ms) | ratio p50 |
| --- | --- | --- | --- |
${rows.join("\n")}

${summary(ratios)}`,
  );
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await run();
