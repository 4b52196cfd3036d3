import { AsyncLocalStorage } from "node:async_hooks";

/**
 * Steering the file system calls of lock take-overs that race in one process, each racer in its own
 * async context so every call can say whose it is. A test file routes `node:fs/promises` through
 * `steeredFsPromises` (in its `vi.mock` factory: this module imports no `fs` itself), then drives
 * one interleaving with `interleaveTakeOver`.
 */
export const steer = {
  actor: new AsyncLocalStorage<string>(),
  /** Awaited after each file system call settles, with the caller's name and the call. */
  after: async (_who: string | undefined, _call: string, _args: unknown[], _result: unknown): Promise<void> => undefined,
};

/** `node:fs/promises` whose every call awaits `steer.after` once it settled. */
export function steeredFsPromises(actual: Record<string, unknown>): Record<string, unknown> {
  const steered: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(actual)) {
    if (typeof value !== "function") {
      steered[name] = value;
      continue;
    }
    steered[name] = (...args: unknown[]) => {
      const result: unknown = (value as (...a: unknown[]) => unknown)(...args);
      if (!(result instanceof Promise)) return result;
      const who = steer.actor.getStore();
      return result.then(
        async (value: unknown) => (await steer.after(who, name, args, value), value),
        async (error: unknown) => {
          await steer.after(who, name, args, undefined);
          throw error;
        },
      );
    };
  }
  return { ...steered, default: steered };
}

/** The whole content of a file handle `open` gave, read at explicit positions so the handle's own offset stays put. */
async function contentOf(handle: unknown): Promise<string> {
  const h = handle as { read(buffer: Buffer, offset: number, length: number, position: number): Promise<{ bytesRead: number }> };
  const buffer = Buffer.alloc(8192);
  const { bytesRead } = await h.read(buffer, 0, buffer.length, 0);
  return buffer.toString("utf8", 0, bytesRead);
}

function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => (open = resolve));
  return { promise, open };
}

export interface Interleaving<T> {
  a: T;
  b: Promise<T>;
  c: Promise<T>;
  /** Whether C ran before B had made its k-th call after going on (else B had none left). */
  cInsideB: boolean;
}

/**
 * One interleaving of three racers against the stale lock file at `path` (holding `stale`): B reads
 * it and stalls; A takes the lock over completely; then B goes on, and C starts (or, with
 * `cReadStaleFirst`, having read the stale file too, goes on) right after B's k-th file system call,
 * or once B finished when it had fewer. `start(name)` acquires as that racer. Every racer has
 * settled when it returns.
 */
export async function interleaveTakeOver<T>(options: {
  path: string;
  stale: string;
  k: number;
  cReadStaleFirst: boolean;
  start: (name: "A" | "B" | "C") => Promise<T>;
}): Promise<Interleaving<T>> {
  const { path, stale, k, cReadStaleFirst } = options;
  const start = (name: "A" | "B" | "C") => steer.actor.run(name, () => options.start(name));
  const stalled = { B: gate(), C: gate() };
  const goOn = { B: gate(), C: gate() };
  let bCalls = -1; // counting starts once B goes on
  let c: Promise<T> | undefined;
  const runC = () => {
    if (cReadStaleFirst) goOn.C.open();
    else c = start("C");
    return c!.then(
      () => undefined,
      () => undefined,
    );
  };
  let cInsideB = false;
  steer.after = async (who, call, args, result) => {
    if ((who === "B" || who === "C") && call === "open" && args[0] === path && stalled[who] && (await contentOf(result)) === stale) {
      // Its first read of the stale file (a lock file is read through an open handle, bounded): it
      // stalls there until told to go on, and reads what that handle holds, the stale file.
      const first = stalled[who];
      stalled[who] = undefined as never;
      first.open();
      await goOn[who].promise;
      return;
    }
    if (who === "B" && bCalls >= 0 && ++bCalls === k) {
      cInsideB = true;
      await runC();
    }
  };
  try {
    const b = start("B");
    const waits = [stalled.B.promise];
    if (cReadStaleFirst) {
      c = start("C");
      waits.push(stalled.C.promise);
    }
    await Promise.all(waits);
    const a = await start("A");
    bCalls = 0;
    if (k === 0) {
      cInsideB = true;
      await runC();
    }
    goOn.B.open();
    await b.catch(() => undefined);
    if (!cInsideB) await runC();
    return { a, b, c: c!, cInsideB };
  } finally {
    steer.after = async () => undefined;
  }
}
