import { readFileSync } from "node:fs";
import { chmod, chown, mkdir, mkdtemp, readdir, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT_DEPLOYMENT_FILE } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";
import { MAIN, asAccount, cli, ensureBuilt, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/**
 * The systemd setup of docs/operations.md on one host: the coordinator runs as the unit's own
 * account with the unit's UMask; a Gym server runs as another account in the coordinator's group
 * with umask 0002; the checkpoint root belongs to the coordinator's account, setgid and
 * group-writable. The participant must be able to commit into the checkpoint directories the
 * coordinator creates, and retention must still remove the participant's files.
 *
 * Needs root (setpriv to other uids, chown): skipped otherwise.
 */
const IS_ROOT = process.getuid?.() === 0;
const UNIT = readFileSync(new URL("../../deploy/systemd/gym-ckpt-coordinator.service", import.meta.url), "utf8");
/** The unit's UMask (systemd's default is 0022). */
const UNIT_UMASK = Number.parseInt(/^UMask=([0-7]+)$/m.exec(UNIT)?.[1] ?? "0022", 8);
const COORDINATOR = { uid: 64_981, gid: 64_981 }; // the unit's gym-ckpt user and group
const GYM = { uid: 64_982, gid: 64_982 }; // a Gym server's own account, a member of gym-ckpt
const TOKEN = "deploy-shared-token";

let nats: NatsFixture | undefined;
let dir: string | undefined;
const processes: DaemonProcess[] = [];

beforeAll(async () => {
  if (!IS_ROOT) return;
  ensureBuilt();
  nats = await startNats();
  // Not under the run's TMPDIR (root's, mode 0700): the other accounts must reach the root.
  dir = await mkdtemp("/tmp/gym-ckpt-deploy-shared-");
  await chmod(dir, 0o755);
});

afterAll(async () => {
  await Promise.allSettled(processes.map((p) => p.kill()));
  await nats?.close().catch(() => undefined);
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe.skipIf(!IS_ROOT)("the systemd deployment's shared checkpoint root (needs root)", () => {
  it("a Gym server under another account commits into the coordinator's checkpoint directories, and retention removes them", async () => {
    const root = join(dir!, "checkpoints");
    await mkdir(root);
    await chown(root, COORDINATOR.uid, COORDINATOR.gid);
    await chmod(root, 0o2770);
    const env = { GYM_CKPT_TOKEN: TOKEN, GYM_CKPT_NATS_URL: nats!.server.url, GYM_CKPT_DEPLOYMENT: `deployshared${process.pid}`, GYM_CKPT_CHECKPOINT_ROOT: root, HOME: "/" };
    const coordinator = spawnDaemon(
      [MAIN, "coordinator", "--http-port", "0", "--lease-ms", "500", "--retention", "1", "--log-level", "warn"],
      env,
      asAccount({ ...COORDINATOR, umask: UNIT_UMASK }),
    );
    processes.push(coordinator);
    const gym = spawnDaemon(["dist/participants/gym/resources-server/main.js", "--instance", "r1", "--metrics-port", "0"], env, asAccount({ ...GYM, groups: [COORDINATOR.gid], umask: 0o002 }));
    processes.push(gym);
    const controller = { ...env, GYM_CKPT_CONTROLLER_TOKEN: TOKEN };
    await waitUntil(async () => {
      if (coordinator.child.exitCode !== null || gym.child.exitCode !== null) throw new Error(`exited:\n${coordinator.stderr()}\n${gym.stderr()}`);
      return (await cli(["status", "--json"], controller)).stdout.includes('"r1"');
    }, "the coordinator to lead with r1 registered", 30_000);

    const published: string[] = [];
    for (let i = 0; i < 2; i++) {
      const result = await cli(["checkpoint"], controller);
      expect(result.stderr).toBe("");
      expect(result.code).toBe(0);
      published.push(/^published (\S+)/.exec(result.stdout)![1]!);
    }
    // The newest holds the participant's files, under its own account.
    const owners = new Set<number>();
    const walk = async (path: string): Promise<void> => {
      for (const entry of await readdir(path, { withFileTypes: true })) {
        owners.add((await stat(join(path, entry.name))).uid);
        if (entry.isDirectory()) await walk(join(path, entry.name));
      }
    };
    await walk(join(root, published[1]!));
    expect([...owners].sort()).toEqual([COORDINATOR.uid, GYM.uid]);
    // Retention (keep 1) moved the first away and removes it, the participant's files included.
    await waitUntil(async () => {
      const names = await readdir(root);
      return !names.includes(published[0]!) && !names.some((name) => name.startsWith(".") && name !== ROOT_DEPLOYMENT_FILE);
    }, "the first checkpoint's directory to be removed", 15_000);
    expect((await readdir(root)).sort()).toEqual([ROOT_DEPLOYMENT_FILE, "LATEST", published[1]!]);
  }, 60_000);
});
