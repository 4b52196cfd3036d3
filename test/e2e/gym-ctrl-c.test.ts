import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { alive, descendants, killAll, TrackedProcesses } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";

/**
 * docs/gym.md: "The command stops every child process on SIGINT or SIGTERM and exits 0". Ctrl-C in a
 * terminal (and systemd's or `timeout`'s SIGTERM) reaches the whole process group: the `gym-ckpt` CLI
 * wrapper, which forwards it to the launcher (participants/gym/main.js), and the launcher itself. The
 * launcher listens with process.once, so the second copy kills it mid-stop and `gym-ckpt gym` exits 130.
 * Reproduced by hand with `kill -INT -- -<pgid>`: 130 in 5 of 6 runs (the order of the two copies varies);
 * here the launcher's copy comes first, then the wrapper's, as a group signal usually delivers them.
 */
let nats: NatsFixture;
const seen = new TrackedProcesses();
beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  killAll(seen);
  await nats?.close();
});

describe("gym-ckpt gym and Ctrl-C", () => {
  it("exits 0 when SIGINT reaches both the CLI wrapper and the launcher (a terminal's Ctrl-C)", { timeout: 60_000 }, async () => {
    const gym: ChildProcess = spawn(process.execPath, ["dist/coordinator/cli/main.js", "gym", "--nats", nats.server.url, "--deployment", "ctrl-c", "--token", "t0ken"], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    seen.add(gym.pid!);
    const exited = new Promise<number | null>((resolve) => gym.once("exit", (code) => resolve(code)));
    await new Promise<void>((resolve, reject) => {
      createInterface({ input: gym.stdout! }).on("line", (line) => {
        if (line.includes('"name":"gym"') && line.includes('"ready":true')) resolve();
      });
      void exited.then((code) => reject(new Error(`gym exited early (${code})`)));
    });
    const started = descendants(gym.pid!);
    for (const p of started) seen.add(p.pid);
    const launcher = started.find((p) => p.cmdline.includes("participants/gym/main.js"))!;
    expect(launcher).toBeDefined();
    process.kill(launcher.pid, "SIGINT");
    gym.kill("SIGINT");
    const code = await exited;
    await waitUntil(() => started.every((p) => !alive(p.pid)), "every child of the gym to exit");
    // Fails today: 130 (the launcher died of the second SIGINT).
    expect(code).toBe(0);
  });
});
