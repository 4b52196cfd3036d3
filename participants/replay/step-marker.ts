import path from "node:path";
import { isUnreadableStorage, MAX_ROLLOUT_STEP_MARKER_BYTES, RECORD_KINDS, rolloutStepMarkerFiles, rolloutStepMarkerName as stepMarkerName } from "../../protocol/index.js";
import { readRegularFile } from "../storage/regular-file.js";
import { stepOfPath } from "./record-paths.js";

/**
 * A step-complete marker, written after every env file of one (step, kind) is published.
 * Envs of a step are written concurrently and can appear in any order; a follower that waits
 * for the marker appends a step's files all at once, in sorted order, like a cold loader would.
 * The schema and name are the protocol's, so the collector writes the same marker.
 */
export { RolloutStepMarkerSchema as StepMarkerSchema, rolloutStepMarkerName as stepMarkerName } from "../../protocol/index.js";
export type { RolloutStepMarker as StepMarker } from "../../protocol/index.js";

/** Markers are never records, even when a broad glob matches them. */
export function isStepMarkerName(fileName: string): boolean {
  return /^_complete_(train|eval)\.json$/.test(fileName);
}

/**
 * Record file names listed by the markers present in `dir`. Missing or invalid markers count as
 * absent, and so does a FIFO, device or oversized file there: it is refused unread, never waited on.
 * A marker the storage refuses to read (EACCES, EIO) is thrown, as for a record file.
 * So does a marker written for another step (copied in: it names the same files) or another kind,
 * and a marker completes only the files of its own kind it lists.
 */
export async function completedFiles(dir: string): Promise<Set<string>> {
  const files = new Set<string>();
  for (const kind of RECORD_KINDS) {
    const markerPath = path.join(dir, stepMarkerName(kind));
    const step = stepOfPath(markerPath);
    if (step === null) continue; // only a step_<N> directory has markers
    let raw: unknown;
    try {
      raw = JSON.parse((await readRegularFile(markerPath, { maxBytes: MAX_ROLLOUT_STEP_MARKER_BYTES })).toString("utf8"));
    } catch (error) {
      // The storage refusing (EACCES, EIO, EMFILE) refuses the reload, as for a record file or a
      // listing: read as absent, the step would wait for ever without a word.
      if (isUnreadableStorage(error)) throw error;
      continue;
    }
    for (const name of rolloutStepMarkerFiles(raw, step, kind) ?? []) files.add(name);
  }
  return files;
}
