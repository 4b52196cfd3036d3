import type { ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startChildProgram, type ChildProgram } from "../../coordinator/local/child-program.js";
import type { Op } from "../../protocol/index.js";
import { controlRequest, phase } from "./control-requests.js";
import { startNats, type NatsFixture } from "./nats.js";

/**
 * The world of the resources e2e tests: a real nats-server, reference resources servers spawned
 * from dist/ (killed with SIGKILL to crash them), and control requests sent straight over NATS.
 */
const MAIN = join(process.cwd(), "dist/participants/gym/resources-server/main.js");

export interface ResourcesWorld {
  nats: NatsFixture;
  root: string;
  /** Starts `resources-server --server <args…>` and waits for its ready line. */
  spawn(args: string[]): Promise<{ child: ChildProcess; url: string }>;
  kill(child: ChildProcess): Promise<void>;
  killAll(): Promise<void>;
  control(op: Op, body: object): Promise<any>;
  close(): Promise<void>;
}

export async function startResourcesWorld(deployment: string, instance: string, token: string): Promise<ResourcesWorld> {
  const nats = await startNats();
  const root = await mkdtemp(join(tmpdir(), "gym-ckpt-res-e2e-"));
  const programs = new Map<ChildProcess, ChildProgram>();
  const world: ResourcesWorld = {
    nats,
    root,
    async spawn(args) {
      const program = await startChildProgram(
        MAIN,
        [...args, "--nats", nats.server.url, "--deployment", deployment, "--instance", instance, "--token", token, "--checkpoint-root", root],
        { waitReady: true, readyTimeoutMs: 20_000 },
      );
      programs.set(program.child, program);
      return { child: program.child, url: String(program.ready!.url) };
    },
    async kill(child) {
      await programs.get(child)?.kill("SIGKILL");
      programs.delete(child);
    },
    async killAll() {
      await Promise.all([...programs.values()].map((p) => p.kill("SIGKILL")));
      programs.clear();
    },
    control(op, body) {
      return controlRequest(nats.nc, { deployment, kind: "resources", instance, token }, op, body);
    },
    async close() {
      await world.killAll();
      await nats.close();
      await rm(root, { recursive: true, force: true });
    },
  };
  return world;
}

export { phase };

/** POST a JSON body to `/ng-rollout/<key><route>`, returning status, body and the session cookie. */
export async function postRollout(url: string, key: string, route: string, cookie?: string, body: object = {}): Promise<{ status: number; body: any; cookie?: string }> {
  const response = await fetch(`${url}/ng-rollout/${key}${route}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(cookie && { cookie }) },
    body: JSON.stringify(body),
  });
  const setCookie = response.headers.get("set-cookie");
  return { status: response.status, body: await response.json(), ...(setCookie && { cookie: setCookie.split(";")[0]! }) };
}
