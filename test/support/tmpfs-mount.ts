import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmdirSync, rmSync, statfsSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/**
 * A real small tmpfs the e2e disk-full tests fill: a disk that refuses writes with ENOSPC, not a
 * mocked error. Needs mount rights (root, not in every CI container): `canMountTmpfs` says whether
 * this machine has them, so those tests are skipped where it does not.
 */
function tryMount(dir: string, size: string): boolean {
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", `size=${size}`, "tmpfs", dir], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

function unmount(dir: string): void {
  try {
    execFileSync("umount", [dir], { stdio: "ignore" });
  } catch {
    execFileSync("umount", ["-l", dir], { stdio: "ignore" }); // something still open there
  }
}

export const canMountTmpfs = (() => {
  const probe = mkdtempSync(join(tmpdir(), "gym-ckpt-mount-probe-"));
  try {
    if (!tryMount(probe, "64k")) return false;
    unmount(probe);
    return true;
  } finally {
    rmdirSync(probe);
  }
})();

export interface SmallDisk {
  dir: string;
  /** Fills the disk but `leave` bytes; the disk's other writers race it, so a write that does not fit is fine. */
  fill(leave: number): void;
  /** Frees what `fill` took. */
  free(): void;
  /** Unmounts and removes the mount point. */
  remove(): void;
}

/** Mounts a tmpfs of `size` (say "4m") at a new directory under the system temp dir. */
export function mountSmallDisk(name: string, size: string): SmallDisk {
  const dir = join(tmpdir(), `${name}-${process.pid}`);
  const filler = join(dir, "filler");
  mkdirSync(dir, { recursive: true });
  if (!tryMount(dir, size)) throw new Error(`could not mount a tmpfs at ${dir}`);
  return {
    dir,
    fill(leave) {
      rmSync(filler, { force: true });
      const { bavail, bsize } = statfsSync(dir);
      const bytes = Number(bavail) * Number(bsize) - leave;
      if (bytes <= 0) return;
      try {
        writeFileSync(filler, Buffer.alloc(bytes));
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "ENOSPC") throw error;
      }
    },
    free() {
      rmSync(filler, { force: true });
    },
    remove() {
      unmount(dir);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
