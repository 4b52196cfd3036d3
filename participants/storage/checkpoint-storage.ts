import type { z } from "zod";
import type { Kind, ParticipantManifest, RecordBase } from "../../protocol/index.js";
import type { WriteGate } from "./write-gate.js";

/** Where one participant's part of one checkpoint lives. */
export interface ParticipantTarget {
  checkpointDir: string;
  checkpointId: string;
  kind: Kind;
  instance: string;
}

export interface WrittenParticipant {
  manifest: ParticipantManifest;
  /** Relative to the checkpoint directory. */
  manifestPath: string;
  manifestSha256: string;
  bytes: number;
}

export interface ReadParticipant<R> {
  manifest: ParticipantManifest;
  records: R[];
  bytes: number;
}

/**
 * Records-then-manifest storage for one participant. Backends: the filesystem (shared or local
 * disk); the JetStream object store mirrors the same layout.
 */
export interface CheckpointStorage {
  write(
    target: ParticipantTarget,
    records: readonly RecordBase[],
    options: { gate: WriteGate; createdAt: number; extra: Record<string, unknown> },
  ): Promise<WrittenParticipant>;
  /** Verifies manifest identity, digest and count; keeps only records `keep` accepts. */
  read<R extends RecordBase>(target: ParticipantTarget, schema: z.ZodType<R>, keep?: (record: R) => boolean): Promise<ReadParticipant<R>>;
}
