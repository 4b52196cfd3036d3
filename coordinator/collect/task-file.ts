import type { Stats } from "node:fs";
import { open, type FileHandle } from "node:fs/promises";
import { CheckpointError } from "../../protocol/index.js";

/**
 * The regular tasks file a collection runs, held open from start-up to its end: every row's line is
 * read through this one descriptor, at its offset. Opened again by path for each row, a file
 * replaced by `mv` mid-run (a new inode at the path) would stop the collection although its lines are
 * still there, and a high `--concurrency` would need a descriptor per send in flight.
 */
export class TaskFile {
  private closing: Promise<void> | undefined;

  private constructor(
    /** Its absolute path, for messages. */
    readonly path: string,
    private readonly handle: FileHandle,
  ) {}

  /**
   * Opens `path` on the file `opened` is (the descriptor the start-up read streams from): another
   * file at the path by now (replaced between the two opens) is not what was validated, and is refused.
   */
  static async openAs(path: string, opened: Stats): Promise<TaskFile> {
    const handle = await open(path, "r");
    try {
      const stats = await handle.stat();
      if (stats.dev !== opened.dev || stats.ino !== opened.ino) throw new CheckpointError("invalid_request", `tasks file ${path} was replaced while it was being opened; start again`);
    } catch (error) {
      await handle.close();
      throw error;
    }
    return new TaskFile(path, handle);
  }

  /**
   * `byteLength` bytes at `offset`: fewer when the file was cut since. Bytes, not text: whether they
   * are still UTF-8 is the caller's to check (decoded, a sequence that is not would read as U+FFFD).
   * Positional reads, so loads at once need no descriptor of their own and do not move one another's place.
   */
  async read(offset: number, byteLength: number): Promise<Buffer> {
    // Rows are one collector's: it closes their file as it ends. Not a fault of the file (which
    // tasksFileError would report as an unreadable --tasks), so coded apart.
    if (this.closing) throw new CheckpointError("invalid_phase", `${this.path}: these task rows belong to a collection that has ended and closed its tasks file; read the tasks again (readTaskRows) for another collector`);
    const bytes = Buffer.alloc(byteLength);
    let read = 0;
    while (read < byteLength) {
      const { bytesRead } = await this.handle.read(bytes, read, byteLength - read, offset + read);
      if (bytesRead === 0) break;
      read += bytesRead;
    }
    return bytes.subarray(0, read);
  }

  /** Lets go of the descriptor (once reads under way have ended: FileHandle.close waits for them); again, a no-op. */
  close(): Promise<void> {
    this.closing ??= this.handle.close().catch(() => undefined);
    return this.closing;
  }
}
