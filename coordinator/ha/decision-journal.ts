import type { KV } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { z } from "zod";
import {
  CheckpointIdSchema,
  ControllerStateInputSchema,
  EpisodeIdSchema,
  InstanceSchema,
  KindSchema,
  journalBucket,
} from "../../protocol/index.js";
import { openBucketAsserted } from "../membership/kv-bucket.js";

/**
 * The durable record of one checkpoint the coordinator is driving, keyed by checkpoint id:
 *   open       prepare was sent; recovery resumes everyone (presumed abort)
 *   decided    the commit decision; recovery re-drives commit (idempotent), then completes
 *   published  (accepted for completeness) a decided entry whose checkpoint.json exists is treated
 *              the same way, so publication needs no journal write: recovery sends no resume; it
 *              keeps the checkpoint open (published) while a participant may hold it, else closes it
 *   restoring  restore was sent; recovery retires attempt+1 everywhere, then resumes
 *   restored   every participant restored; recovery keeps it for the controller to resume
 * The entry is removed once everyone was resumed.
 */
export const JournalEntrySchema = z
  .object({
    checkpoint_id: CheckpointIdSchema,
    epoch: z.number().int().min(0),
    state: z.enum(["open", "decided", "published", "restoring", "restored"]),
    participants: z.array(z.object({ kind: KindSchema, instance: InstanceSchema }).strict()),
    prepared_at: z.number(),
    checkpoint_dir: z.string().nullable(),
    scope: z.array(EpisodeIdSchema).nullable(),
    stop: z.boolean(),
    restarts: z.array(z.string()),
    /** Set by the convenience `checkpoint` op: recovery publishes and resumes after commit. */
    auto_publish: z.boolean(),
    controller_state: ControllerStateInputSchema.nullable(),
    updated_at: z.number(),
  })
  .strict();
export type JournalEntry = z.infer<typeof JournalEntrySchema>;

export interface DecisionJournal {
  /** Durably records the entry; resolves only after the server acknowledged it. */
  record(entry: JournalEntry): Promise<void>;
  remove(checkpointId: string): Promise<void>;
  list(): Promise<JournalEntry[]>;
}

/** The journal in a JetStream KV bucket without TTL (history 1); entries survive coordinator crashes. */
export class KvDecisionJournal implements DecisionJournal {
  private constructor(private readonly kv: KV) {}

  static async open(nc: NatsConnection, deployment: string): Promise<KvDecisionJournal> {
    return new KvDecisionJournal(await openBucketAsserted(nc, journalBucket(deployment), { history: 1, ttl: 0 }));
  }

  async record(entry: JournalEntry): Promise<void> {
    await this.kv.put(entry.checkpoint_id, JSON.stringify(JournalEntrySchema.parse(entry)));
  }

  async remove(checkpointId: string): Promise<void> {
    await this.kv.purge(checkpointId);
  }

  async list(): Promise<JournalEntry[]> {
    const keys: string[] = [];
    for await (const key of await this.kv.keys()) keys.push(key);
    const entries: JournalEntry[] = [];
    for (const key of keys) {
      const e = await this.kv.get(key);
      if (!e || e.operation !== "PUT") continue;
      const parsed = JournalEntrySchema.safeParse(e.json());
      if (parsed.success) entries.push(parsed.data);
    }
    return entries.sort((a, b) => a.updated_at - b.updated_at);
  }
}

/** In-memory journal for unit tests and single-process tools. */
export class MemoryDecisionJournal implements DecisionJournal {
  readonly entries = new Map<string, JournalEntry>();
  readonly log: { op: "record" | "remove"; checkpoint_id: string; state?: JournalEntry["state"] }[] = [];
  async record(entry: JournalEntry): Promise<void> {
    this.entries.set(entry.checkpoint_id, JournalEntrySchema.parse(structuredClone(entry)));
    this.log.push({ op: "record", checkpoint_id: entry.checkpoint_id, state: entry.state });
  }
  async remove(checkpointId: string): Promise<void> {
    this.entries.delete(checkpointId);
    this.log.push({ op: "remove", checkpoint_id: checkpointId });
  }
  async list(): Promise<JournalEntry[]> {
    return [...this.entries.values()].sort((a, b) => a.updated_at - b.updated_at);
  }
}
