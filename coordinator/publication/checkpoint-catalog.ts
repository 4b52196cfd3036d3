import { readdir, readFile, stat } from "node:fs/promises";
import { join } from "node:path";
import {
  CheckpointError,
  CheckpointIdSchema,
  GLOBAL_MANIFEST_FILE,
  GlobalManifestSchema,
  LATEST_FILE,
  describeZodError,
  type GlobalManifest,
} from "../../protocol/index.js";

const MAX_GLOBAL_MANIFEST_BYTES = 64 << 20;

export interface CatalogEntry {
  checkpoint_id: string;
  published_at: number;
  epoch: number;
  participants: number;
  stop: boolean;
}

/** Reads the published checkpoints under a root: `<root>/<id>/checkpoint.json` and `<root>/LATEST`. */
export class CheckpointCatalog {
  constructor(readonly root: string) {}

  dirFor(checkpointId: string): string {
    return join(this.root, CheckpointIdSchema.parse(checkpointId));
  }

  /** The id LATEST names, or null when nothing was published yet. */
  async latest(): Promise<string | null> {
    let text: string;
    try {
      text = await readFile(join(this.root, LATEST_FILE), "utf8");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
      throw error;
    }
    const id = text.trim();
    const parsed = CheckpointIdSchema.safeParse(id);
    if (!parsed.success) throw new CheckpointError("invalid_checkpoint_state", `${LATEST_FILE} does not name a checkpoint id`);
    return parsed.data;
  }

  /** The global manifest of a published checkpoint; `not_found` when it has none. */
  async get(checkpointId: string): Promise<GlobalManifest> {
    const parsedId = CheckpointIdSchema.safeParse(checkpointId);
    if (!parsedId.success) throw new CheckpointError("invalid_request", describeZodError(parsedId.error));
    const path = join(this.root, checkpointId, GLOBAL_MANIFEST_FILE);
    let text: string;
    try {
      const info = await stat(path);
      if (info.size > MAX_GLOBAL_MANIFEST_BYTES) throw new CheckpointError("invalid_checkpoint_state", `${path} is too large`);
      text = await readFile(path, "utf8");
    } catch (error) {
      if (error instanceof CheckpointError) throw error;
      if ((error as NodeJS.ErrnoException).code === "ENOENT") throw new CheckpointError("not_found", `checkpoint ${checkpointId} is not published under ${this.root}`);
      throw error;
    }
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch {
      throw new CheckpointError("invalid_checkpoint_state", `${path} is not valid JSON`);
    }
    const parsed = GlobalManifestSchema.safeParse(value);
    if (!parsed.success) throw new CheckpointError("invalid_checkpoint_state", `${path} is invalid: ${describeZodError(parsed.error)}`);
    if (parsed.data.checkpoint_id !== checkpointId) {
      throw new CheckpointError("invalid_checkpoint_state", `${path} belongs to checkpoint ${parsed.data.checkpoint_id}`);
    }
    return parsed.data;
  }

  /** Directories under the root, split into published (valid checkpoint.json) and partial ones. */
  async scan(): Promise<{ published: CatalogEntry[]; partial: string[] }> {
    let names: string[];
    try {
      names = (await readdir(this.root, { withFileTypes: true })).filter((d) => d.isDirectory()).map((d) => d.name);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return { published: [], partial: [] };
      throw error;
    }
    const published: CatalogEntry[] = [];
    const partial: string[] = [];
    for (const name of names) {
      if (!CheckpointIdSchema.safeParse(name).success) continue;
      try {
        const m = await this.get(name);
        published.push({ checkpoint_id: name, published_at: m.published_at, epoch: m.epoch, participants: m.participants.length, stop: m.stop });
      } catch (error) {
        if (error instanceof CheckpointError && error.code === "not_found") partial.push(name);
        // A corrupt checkpoint.json is neither listed nor deleted: `verify` reports it.
      }
    }
    published.sort((a, b) => b.published_at - a.published_at || (a.checkpoint_id < b.checkpoint_id ? 1 : -1));
    return { published, partial };
  }
}
