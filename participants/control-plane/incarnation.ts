import { randomBytes } from "node:crypto";

/**
 * A fresh process incarnation. Generated once per participant and given to both its control plane
 * (which refuses guarded messages addressed to another incarnation) and its membership
 * announcement (from which the coordinator learns whom to address), so the two always agree.
 */
export function newIncarnation(): string {
  return randomBytes(8).toString("hex");
}
