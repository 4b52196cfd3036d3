import { readdirSync, statSync } from "node:fs";

/**
 * How many of this process's descriptors are open on the inode `ino` (from /proc: Linux), whatever
 * path now names it (a file replaced by `mv` or removed keeps its inode while a descriptor holds it).
 */
export function descriptorsOn(ino: number): number {
  return readdirSync("/proc/self/fd").filter((fd) => {
    try {
      return statSync(`/proc/self/fd/${fd}`).ino === ino;
    } catch {
      return false; // closed meanwhile (the listing's own descriptor among them)
    }
  }).length;
}

/** How many descriptors this process has open (from /proc: Linux). */
export function openDescriptors(): number {
  return readdirSync("/proc/self/fd").length;
}
