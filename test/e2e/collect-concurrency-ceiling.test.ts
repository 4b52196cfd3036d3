import { existsSync } from "node:fs";
import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, it } from "vitest";
import { startChildProgram, type ChildProgram } from "../../coordinator/local/child-program.js";
import { maxRowsInFlight } from "../../coordinator/collect/scope-ceiling.js";
import { collectArgs } from "../support/collect-args.js";

/**
 * `gym-ckpt collect --concurrency` past the ceiling of rows whose checkpoint scope fits one control
 * message: refused at the start (invalid_request, exit 2, naming the flag and the ceiling), before
 * anything is created or connected. Without it, every checkpoint of such a run was refused
 * payload_too_large and the run never checkpointed. Nothing listens at the NATS URL: a start that
 * got that far would fail there instead (not_leader, exit 1).
 */
const CLI = fileURLToPath(new URL("../../dist/coordinator/cli/main.js", import.meta.url));

let root: string | undefined;
let collector: ChildProgram | undefined;
afterEach(async () => {
  await collector?.kill("SIGKILL").catch(() => undefined);
  if (root) await rm(root, { recursive: true, force: true });
  collector = root = undefined;
});

/** Runs collect over `rows` rows r0…, with `--concurrency n`, to its exit. */
async function collect(rows: number, concurrency: number): Promise<{ exit: unknown; out: string[]; ckpt: string }> {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-e2e-concurrency-"));
  await writeFile(join(root, "tasks.jsonl"), Array.from({ length: rows }, (_, i) => `${JSON.stringify({ id: `r${i}`, task: {} })}\n`).join(""));
  const ckpt = join(root, "ckpt");
  const out: string[] = [];
  collector = await startChildProgram(
    CLI,
    collectArgs({ natsUrl: "nats://127.0.0.1:4", deployment: "ceiling", token: "controller-token", root, runUrl: "http://127.0.0.1:8/run" }, [
      "--checkpoint-dir", ckpt,
      "--concurrency", String(concurrency),
      "--leader-wait-ms", "0",
    ]),
    { onLine: (line) => out.push(line) },
  );
  const exit = await Promise.race([collector.exited, new Promise((r) => setTimeout(() => r("still running after 20 s"), 20_000))]);
  return { exit, out, ckpt };
}

describe("collect --concurrency ceiling", () => {
  it("a --concurrency over the ceiling is refused at the start: invalid_request, exit 2, naming the flag and the ceiling; nothing created", { timeout: 30_000 }, async () => {
    // Rollout ids r0 … r<rows-1>: the longest has as many characters as the largest index.
    const rows = maxRowsInFlight(6) + 10;
    const ceiling = maxRowsInFlight(`r${rows - 1}`.length);
    const { exit, out, ckpt } = await collect(rows, ceiling + 1);
    expect(exit, out.join("\n")).toEqual({ code: 2, signal: null });
    expect(out.some((l) => l.startsWith(`error invalid_request: --concurrency ${ceiling + 1} is over ${ceiling},`)), out.join("\n")).toBe(true);
    expect(existsSync(ckpt)).toBe(false);
    expect((await readdir(root!)).sort()).toEqual(["tasks.jsonl"]);
  });

  it("the ceiling itself is accepted (the start goes on, here to the NATS nobody serves: not_leader, exit 1)", { timeout: 30_000 }, async () => {
    const rows = maxRowsInFlight(6) + 10;
    const ceiling = maxRowsInFlight(`r${rows - 1}`.length);
    const { exit, out } = await collect(rows, ceiling);
    expect(exit, out.join("\n")).toEqual({ code: 1, signal: null });
    expect(out.some((l) => l.startsWith("error not_leader")), out.join("\n")).toBe(true);
  });

  it("a --concurrency over the ceiling with no more rows than it: the rows bound what is in flight, so it is accepted", { timeout: 30_000 }, async () => {
    const { exit, out } = await collect(3, 1_000_000_000);
    expect(exit, out.join("\n")).toEqual({ code: 1, signal: null });
    expect(out.some((l) => l.startsWith("error not_leader")), out.join("\n")).toBe(true);
  });
});
