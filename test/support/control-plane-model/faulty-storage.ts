import type { z } from "zod";
import { CheckpointError, type RecordBase } from "../../../protocol/index.js";
import type { CheckpointStorage, ParticipantTarget, PinnedManifest, ReadParticipant, WrittenParticipant } from "../../../participants/storage/checkpoint-storage.js";
import { FsCheckpointStorage } from "../../../participants/storage/fs-storage.js";
import type { WriteGate } from "../../../participants/storage/write-gate.js";
import { deferred } from "../deferred.js";

/**
 * The filesystem storage with the faults a model-based test scripts: the next write fails before
 * anything is written (a full disk), or waits until the test releases it (a slow shared filesystem).
 * It keeps the last write's promise, so a test can wait for a write that outlived its commit.
 */
export class FaultyStorage implements CheckpointStorage {
  private readonly inner = new FsCheckpointStorage();
  private failNext = false;
  private hold: ReturnType<typeof deferred> | undefined;
  private started: ReturnType<typeof deferred> | undefined;
  lastWrite: Promise<unknown> | undefined;
  /** A held write, once released, fails (a disk that filled meanwhile). */
  failHeldWrite = false;
  /** The records the last write was handed (an export happened), until the test takes them back. */
  lastWriteRecords: readonly RecordBase[] | undefined;

  /** The next write fails with storage_error before it writes anything. */
  failNextWrite(): void {
    this.failNext = true;
  }

  /** Takes back a failure armed for a message that never reached the write. */
  clearFaults(): void {
    this.failNext = false;
  }

  /** The next write waits until `release()`; the returned promise settles once it started waiting. */
  holdNextWrite(): { started: Promise<void>; release: () => void } {
    this.hold = deferred();
    this.started = deferred();
    const hold = this.hold;
    return { started: this.started.promise, release: () => hold.resolve() };
  }

  write(target: ParticipantTarget, records: readonly RecordBase[], options: { gate: WriteGate; createdAt: number; extra: Record<string, unknown>; existingCheckpointDir?: boolean }): Promise<WrittenParticipant> {
    this.lastWriteRecords = records;
    const run = async () => {
      if (this.failNext) {
        this.failNext = false;
        throw new CheckpointError("storage_error", "ENOSPC: scripted full disk");
      }
      const hold = this.hold;
      this.hold = undefined;
      if (hold) {
        this.started?.resolve();
        await hold.promise;
        if (this.failHeldWrite) {
          this.failHeldWrite = false;
          throw new CheckpointError("storage_error", "ENOSPC: scripted full disk");
        }
      }
      return this.inner.write(target, records, options);
    };
    const writing = run();
    this.lastWrite = writing.catch(() => undefined);
    return writing;
  }

  read<R extends RecordBase>(target: ParticipantTarget, schema: z.ZodType<R>, keep?: (record: R) => boolean, pinned?: PinnedManifest): Promise<ReadParticipant<R>> {
    return this.inner.read(target, schema, keep, pinned);
  }
}
