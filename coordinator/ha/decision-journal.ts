import type { KV } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "pino";
import { z } from "zod";
import {
  CheckpointError,
  CheckpointIdSchema,
  ControllerStateInputSchema,
  describeZodError,
  EpisodeIdSchema,
  InstanceSchema,
  KindSchema,
  MAX_CONTROL_MESSAGE_BYTES,
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
 *   restoring  restore was sent; recovery sends it again (participants that restored answer from
 *              their reply cache): all restored → restored; else attempt+1 is retired where it may
 *              have been installed, and everyone resumes
 *   restored   every participant restored; recovery sends it again to rebuild the reply (a retry
 *              gets it), then keeps it for the controller to resume
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

/**
 * An entry must fit one NATS message, and the commit and restore messages carry the same scope:
 * the headroom covers their other fields and headers (a bound of about 20k episodes in a scope).
 */
export const MAX_JOURNAL_ENTRY_BYTES = MAX_CONTROL_MESSAGE_BYTES - 16 * 1024;

/**
 * Refuses an entry too large to journal with `payload_too_large`. The engine calls it before it
 * changes anything (nothing sent, nothing opened), so an oversized scope or controller state is a
 * clean refusal rather than a checkpoint stuck half-way.
 */
export function assertJournalEntryFits(entry: JournalEntry): string {
  const text = JSON.stringify(entry);
  const size = Buffer.byteLength(text);
  if (size > MAX_JOURNAL_ENTRY_BYTES) {
    throw new CheckpointError(
      "payload_too_large",
      `checkpoint ${entry.checkpoint_id}: its journal entry (scope, restarts, inline controller state, members) is ${size} bytes; the limit is ${MAX_JOURNAL_ENTRY_BYTES}`,
    );
  }
  return text;
}

export interface DecisionJournal {
  /** Durably records the entry; resolves only after the server acknowledged it. */
  record(entry: JournalEntry): Promise<void>;
  remove(checkpointId: string): Promise<void>;
  list(): Promise<JournalEntry[]>;
}

/** The journal in a JetStream KV bucket without TTL (history 1); entries survive coordinator crashes. */
export class KvDecisionJournal implements DecisionJournal {
  private constructor(
    private readonly kv: KV,
    private readonly logger?: Logger,
  ) {}

  static async open(nc: NatsConnection, deployment: string, logger?: Logger): Promise<KvDecisionJournal> {
    return new KvDecisionJournal(await openBucketAsserted(nc, journalBucket(deployment), { history: 1, ttl: 0 }), logger?.child({ component: "journal" }));
  }

  async record(entry: JournalEntry): Promise<void> {
    await this.kv.put(entry.checkpoint_id, assertJournalEntryFits(JournalEntrySchema.parse(entry)));
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
      // A value nothing here wrote (not JSON, or not an entry) cannot be acted on: skipped, and
      // logged each time, rather than failing recovery (and so every controller op) for good.
      let value: unknown;
      try {
        value = e.json();
      } catch {
        this.logger?.error({ key, revision: e.revision, bytes: e.length }, "journal_entry_not_json_skipped");
        continue;
      }
      const parsed = JournalEntrySchema.safeParse(value);
      if (parsed.success) entries.push(parsed.data);
      else this.logger?.error({ key, revision: e.revision, detail: describeZodError(parsed.error) }, "journal_entry_invalid_skipped");
    }
    return entries.sort((a, b) => a.updated_at - b.updated_at);
  }
}

/** In-memory journal for unit tests and single-process tools. */
export class MemoryDecisionJournal implements DecisionJournal {
  readonly entries = new Map<string, JournalEntry>();
  readonly log: { op: "record" | "remove"; checkpoint_id: string; state?: JournalEntry["state"] }[] = [];
  async record(entry: JournalEntry): Promise<void> {
    assertJournalEntryFits(entry);
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
