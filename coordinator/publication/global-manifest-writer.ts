import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import {
  CheckpointError,
  GLOBAL_MANIFEST_FILE,
  GlobalManifestSchema,
  LATEST_FILE,
  MANIFEST_SCHEMA_VERSION,
  type ControllerState,
  type ControllerStateInput,
  type EpisodeId,
  type GlobalManifest,
  type ParticipantEntry,
} from "../../protocol/index.js";
import type { CheckpointCatalog } from "./checkpoint-catalog.js";
import { replaceFileDurably } from "./durable-fs.js";
import { applyRetention } from "./retention.js";

export interface PublishInput {
  checkpointId: string;
  epoch: number;
  preparedAt: number;
  publishedAt: number;
  stop: boolean;
  scope: EpisodeId[] | null;
  restarts: string[];
  participants: ParticipantEntry[];
  controllerState: ControllerStateInput | null;
  /** Ids retention must not delete besides the one being published. */
  protect?: string[];
  /** Skip retention here; the caller runs `retain` later (off the critical path). */
  deferRetention?: boolean;
}

export interface PublishResult {
  manifestPath: string;
  manifest: GlobalManifest;
  deleted: string[];
}

/**
 * Publication, only after every commit succeeded: the global checkpoint.json last in the checkpoint
 * directory, then LATEST atomically replaced at the root, then retention.
 */
export class GlobalManifestWriter {
  constructor(
    private readonly catalog: CheckpointCatalog,
    private readonly retention: number,
  ) {}

  async publish(input: PublishInput): Promise<PublishResult> {
    const dir = this.catalog.dirFor(input.checkpointId);
    await mkdir(dir, { recursive: true });
    const controllerState = await this.resolveControllerState(dir, input.controllerState);
    const manifest = GlobalManifestSchema.parse({
      schema_version: MANIFEST_SCHEMA_VERSION,
      checkpoint_id: input.checkpointId,
      epoch: input.epoch,
      prepared_at: input.preparedAt,
      published_at: input.publishedAt,
      stop: input.stop,
      scope: input.scope,
      restarts: [...new Set(input.restarts)].sort(),
      participants: [...input.participants].sort((a, b) => (a.kind + "/" + a.instance < b.kind + "/" + b.instance ? -1 : 1)),
      controller_state: controllerState,
    } satisfies GlobalManifest);
    const manifestPath = join(dir, GLOBAL_MANIFEST_FILE);
    await replaceFileDurably(manifestPath, `${JSON.stringify(manifest, null, 2)}\n`);
    await replaceFileDurably(join(this.catalog.root, LATEST_FILE), `${input.checkpointId}\n`);
    const deleted = input.deferRetention ? [] : await this.retain(input.checkpointId, input.protect ?? []);
    return { manifestPath, manifest, deleted };
  }

  /** Keeps the newest N published checkpoints (never `latest`) and deletes partial ones. */
  retain(latest: string, protect: string[] = []): Promise<string[]> {
    return applyRetention(this.catalog, this.retention, new Set([latest, ...protect]), latest);
  }

  private async resolveControllerState(dir: string, input: ControllerStateInput | null): Promise<ControllerState | null> {
    if (input === null) return null;
    if ("inline" in input) return { inline: input.inline ?? null };
    const path = join(dir, input.file);
    let digest: string;
    try {
      digest = await sha256File(path);
    } catch (error) {
      throw new CheckpointError("not_found", `controller state file ${input.file} is not in the checkpoint directory`, { cause: error });
    }
    if (input.sha256 !== undefined && input.sha256 !== digest) {
      throw new CheckpointError("invalid_checkpoint_state", `controller state file ${input.file} has sha256 ${digest}, not ${input.sha256}`);
    }
    return { file: input.file, sha256: digest };
  }
}

export async function sha256File(path: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path) as AsyncIterable<Buffer>) hash.update(chunk);
  return hash.digest("hex");
}
