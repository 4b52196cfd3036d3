import { randomBytes } from "node:crypto";

/** A time-ordered checkpoint id: `ckpt-20261129T073146Z-1a2b3c`. */
export function newCheckpointId(nowMs: number = Date.now()): string {
  const stamp = new Date(nowMs).toISOString().replace(/[-:]/g, "").replace(/\.\d+Z$/, "Z");
  return `ckpt-${stamp}-${randomBytes(3).toString("hex")}`;
}
