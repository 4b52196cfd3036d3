import { promises as fs } from "node:fs";
import path from "node:path";
import { RECORD_KINDS, RolloutStepMarkerSchema as StepMarkerSchema, rolloutStepMarkerName as stepMarkerName } from "../../protocol/index.js";

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

/** Record file names listed by the markers present in `dir` (unreadable or invalid markers count as absent). */
export async function completedFiles(dir: string): Promise<Set<string>> {
  const files = new Set<string>();
  for (const kind of RECORD_KINDS) {
    let text: string;
    try {
      text = await fs.readFile(path.join(dir, stepMarkerName(kind)), "utf8");
    } catch {
      continue;
    }
    let raw: unknown;
    try {
      raw = JSON.parse(text);
    } catch {
      continue;
    }
    const marker = StepMarkerSchema.safeParse(raw);
    if (marker.success) for (const name of marker.data.files) files.add(name);
  }
  return files;
}
