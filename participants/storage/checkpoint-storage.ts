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
  /** The sha256 of manifest.json's exact bytes (what checkpoint.json pins): what a restore installed, pinned or not. */
  manifestSha256: string;
  records: R[];
  bytes: number;
}

/**
 * What a restore message pins of one participant: the sha256 of its manifest.json's exact bytes,
 * as checkpoint.json records it. The manifest names its records' digest and count, so these
 * bytes pin the records too.
 */
export interface PinnedManifest {
  manifest_sha256: string;
}

/**
 * What a published checkpoint.json pins of one participant (its entry's fields): a manifest or
 * records file that differs, even a self-consistent one put there later, was never committed.
 */
export interface PinnedParticipant extends PinnedManifest {
  records_sha256: string;
  record_count: number;
}

/**
 * Records-then-manifest storage for one participant. Backends: the filesystem (shared or local
 * disk); the JetStream object store mirrors the same layout.
 */
export interface CheckpointStorage {
  write(
    target: ParticipantTarget,
    records: readonly RecordBase[],
    /**
     * `existingCheckpointDir`: `target.checkpointDir` must already exist (the control plane's
     * commit: the coordinator made it); only `gym/<kind>/<instance>` is created in it, and a
     * checkpoint directory gone by then is `storage_error`, never made again (mkdir -p would make
     * it on the local disk under a checkpoint storage unmounted meanwhile).
     */
    options: { gate: WriteGate; createdAt: number; extra: Record<string, unknown>; existingCheckpointDir?: boolean },
  ): Promise<WrittenParticipant>;
  /**
   * Verifies manifest identity, digest and count, and the manifest against `pinned` (before any
   * record is read) when given; keeps only records `keep` accepts.
   */
  read<R extends RecordBase>(
    target: ParticipantTarget,
    schema: z.ZodType<R>,
    keep?: (record: R) => boolean,
    pinned?: PinnedManifest | PinnedParticipant,
  ): Promise<ReadParticipant<R>>;
}
