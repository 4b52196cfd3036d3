import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { createInterface } from "node:readline";

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

export async function spawnServer(name: string, entry: string, args: string[], timeoutMs = 20_000): Promise<SpawnedServer> {
  if (!existsSync(entry)) throw new Error(`${entry} is missing; run \`npx tsc -p tsconfig.build.json\` first`);
  const child = spawn(process.execPath, [entry, ...args], { stdio: ["ignore", "pipe", "pipe"] });
  const output: string[] = [];
  const remember = (line: string) => {
    output.push(line);
    if (output.length > 200) output.shift();
    if (process.env.GYM_E2E_VERBOSE) process.stderr.write(`[${name}] ${line}\n`);
  };
  createInterface({ input: child.stderr! }).on("line", remember);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name} not ready in time:\n${output.join("\n")}`)), timeoutMs);
    createInterface({ input: child.stdout! }).on("line", (line) => {
      remember(line);
      try {
        const parsed = JSON.parse(line) as { ready?: boolean; url?: string };
        if (parsed.ready === true && typeof parsed.url === "string") {
          clearTimeout(timer);
          resolve(parsed.url);
        }
      } catch {
        // a log line
      }
    });
    void exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited (${code ?? signal}) before ready:\n${output.join("\n")}`));
    });
  }).catch((error: unknown) => {
    child.kill("SIGKILL");
    throw error;
  });
  return {
    name,
    url: url.replace(/\/+$/, ""),
    child,
    output,
    exited,
    async kill(signal = "SIGKILL") {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      await exited;
    },
  };
}

export const BACKEND_ENTRY = "dist/participants/gym/policy-backend/main.js";
export const PROXY_ENTRY = "dist/participants/attach/main.js";

export function commonArgs(nats: string, deployment: string, instance: string, token: string, extra: string[] = []): string[] {
  return ["--nats", nats, "--deployment", deployment, "--instance", instance, "--token", token, "--port", "0", ...extra];
}

export async function waitUntil(condition: () => Promise<boolean> | boolean, what: string, timeoutMs = 15_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    if (await condition()) return;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
