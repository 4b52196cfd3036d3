import pino from "pino";
import { join } from "node:path";
import { Collector, type CollectorController, type CollectorOptions } from "../../coordinator/collect/collector.js";

/**
 * A coordinator with nothing published and nothing open, for collector tests that need no
 * checkpoint: `overrides` replace single ops (say, a retire that records what it got). Any op
 * neither here nor overridden fails the test.
 */
export function idleController(overrides: Partial<Record<keyof CollectorController, (req: never) => Promise<unknown>>> = {}): CollectorController {
  const ops: Record<string, (req: never) => Promise<unknown>> = {
    list: async () => ({ latest: null, checkpoints: [] }),
    status: async () => ({ checkpoint: null, participants: [] }),
    retire: async () => ({ participants: [] }),
    forget: async (req: { rollout_ids: string[] }) => ({ forgotten: req.rollout_ids }),
    ...overrides,
  };
  return new Proxy({} as CollectorController, {
    get: (_target, op) =>
      ops[String(op)] ??
      (async () => {
        throw new Error(`unexpected controller op ${String(op)}`);
      }),
  });
}

/** A collector of row "a" in `dir` (results in `dir/results.jsonl`), sending its `/run` to `runUrl`. */
export function collectorIn(dir: string, runUrl: string, controller: CollectorController, options: Partial<CollectorOptions> = {}): Collector {
  return new Collector({
    rows: [{ rolloutId: "a", task: {} }],
    runUrl,
    outPath: join(dir, "results.jsonl"),
    checkpointDir: dir,
    controller,
    logger: pino({ level: "silent" }),
    ...options,
  });
}
