import { readdirSync, statSync } from "node:fs";

/**
 * How many of this process's descriptors are open on `file` (its inode on its device; a `statSync`
 * of it), from /proc (Linux), whatever path now names it (a file replaced by `mv` or removed keeps its
 * inode while a descriptor holds it). The device counts too: a pipe's or a socket's inode number (on
 * their own file systems) may equal the file's.
 */
export function descriptorsOn(file: { ino: number; dev: number }): number {
  return readdirSync("/proc/self/fd").filter((fd) => {
    try {
      const open = statSync(`/proc/self/fd/${fd}`);
      return open.ino === file.ino && open.dev === file.dev;
    } catch {
      return false; // closed meanwhile (the listing's own descriptor among them)
    }
  }).length;
}

/** How many descriptors this process has open (from /proc: Linux). */
export function openDescriptors(): number {
  return readdirSync("/proc/self/fd").length;
}
