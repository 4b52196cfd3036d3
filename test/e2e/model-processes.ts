import type { ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { startChildProgram } from "../../coordinator/local/child-program.js";

/**
 * Spawns the model engineer's processes from dist/ (policy backend, attach proxy) and waits for
 * their JSON ready line. Shared by the model integration/e2e tests and the bench.
 */
export interface SpawnedServer {
  name: string;
  url: string;
  child: ChildProcess;
  output: string[];
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  kill(signal?: NodeJS.Signals): Promise<void>;
}

export async function spawnServer(name: string, entry: string, args: string[], timeoutMs = 20_000, env?: NodeJS.ProcessEnv): Promise<SpawnedServer> {
  if (!existsSync(entry)) throw new Error(`${entry} is missing; run \`npx tsc -p tsconfig.build.json\` first`);
  const output: string[] = [];
  const program = await startChildProgram(entry, args, {
    waitReady: true,
    readyTimeoutMs: timeoutMs,
    ...(env && { env }),
    onLine: (line) => {
      output.push(line);
      if (output.length > 200) output.shift();
      if (process.env.GYM_E2E_VERBOSE) process.stderr.write(`[${name}] ${line}\n`);
    },
  });
  return { name, url: String(program.ready!.url).replace(/\/+$/, ""), child: program.child, output, exited: program.exited, kill: program.kill };
}

export const BACKEND_ENTRY = "dist/participants/gym/policy-backend/main.js";
export const PROXY_ENTRY = "dist/participants/attach/main.js";

export function commonArgs(nats: string, deployment: string, instance: string, token: string, extra: string[] = []): string[] {
  return ["--nats", nats, "--deployment", deployment, "--instance", instance, "--token", token, "--port", "0", ...extra];
}
