import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection } from "@nats-io/transport-node";
import { pino } from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { loadConfig } from "../../../coordinator/config/config-loader.js";
import { startCoordinator } from "../../../coordinator/daemon/coordinator-daemon.js";
import { ROOT_DEPLOYMENT_FILE, toCheckpointError } from "../../../protocol/index.js";

/**
 * A coordinator started while the checkpoint storage is not mounted finds the mount point empty
 * (or the root under it missing): the first start's claim, made there, put the deployment on the
 * local disk, its checkpoints hidden once the storage is mounted over them. With
 * `require_existing_root_claim` it refuses to start instead (storage_error: exit 1, the supervisor
 * starts it again, by then mounted), writing nothing.
 */
let base: string;
beforeEach(async () => {
  base = await mkdtemp(join(tmpdir(), "gym-ckpt-require-claim-"));
});
afterEach(async () => {
  await rm(base, { recursive: true, force: true });
});

const env = (root: string, require?: string) => ({
  GYM_CKPT_TOKEN: "t",
  GYM_CKPT_CHECKPOINT_ROOT: root,
  GYM_CKPT_DEPLOYMENT: "job",
  GYM_CKPT_HTTP: "false",
  ...(require !== undefined && { GYM_CKPT_REQUIRE_EXISTING_ROOT_CLAIM: require }),
});

/** The start's refusal: with no NATS connection (`{}`) a start that got past the root fails there instead. */
async function startRefusal(config: ReturnType<typeof loadConfig>) {
  return startCoordinator({ config, nc: {} as NatsConnection, logger: pino({ level: "silent" }) }).then(
    () => {
      throw new Error("expected the start to fail");
    },
    (error: unknown) => toCheckpointError(error),
  );
}

describe("require_existing_root_claim", () => {
  it("is off unless set; GYM_CKPT_REQUIRE_EXISTING_ROOT_CLAIM and the flag's path set it", () => {
    expect(loadConfig({ env: env("/data/ck") }).require_existing_root_claim).toBe(false);
    expect(loadConfig({ env: env("/data/ck", "true") }).require_existing_root_claim).toBe(true);
    expect(loadConfig({ env: env("/data/ck"), flags: { require_existing_root_claim: true } }).require_existing_root_claim).toBe(true);
  });

  it("refuses an empty mount point (the root itself) with storage_error and writes nothing there", async () => {
    const root = join(base, "mnt");
    await mkdir(root);
    const refusal = await startRefusal(loadConfig({ env: env(root, "true") }));
    expect(refusal.code).toBe("storage_error");
    expect(refusal.message).toContain(join(root, ROOT_DEPLOYMENT_FILE));
    expect(refusal.message).toContain("require_existing_root_claim");
    expect(await readdir(root)).toEqual([]);
  });

  it("refuses a root missing under an empty mount point and does not create it", async () => {
    const mount = join(base, "mnt");
    await mkdir(mount);
    const refusal = await startRefusal(loadConfig({ env: env(join(mount, "gym"), "true") }));
    expect(refusal.code).toBe("storage_error");
    expect(await readdir(mount)).toEqual([]);
  });

  it("starts on a root its deployment claimed (refused later only for the missing NATS connection)", async () => {
    const root = join(base, "mnt");
    await mkdir(root);
    await writeFile(join(root, ROOT_DEPLOYMENT_FILE), `${JSON.stringify({ deployment: "job" })}\n`);
    const refusal = await startRefusal(loadConfig({ env: env(root, "true") }));
    expect(refusal.code).not.toBe("storage_error");
    expect(refusal.code).not.toBe("invalid_request");
  });

  it("without it, an empty root is claimed as before", async () => {
    const root = join(base, "mnt");
    await mkdir(root);
    await startRefusal(loadConfig({ env: env(root) }));
    expect(await readdir(root)).toEqual([ROOT_DEPLOYMENT_FILE]);
  });
});
