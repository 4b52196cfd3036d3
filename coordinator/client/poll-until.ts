/**
 * Runs `check` every `everyMs` (the first time at once with `first: "now"`) until it returns a value,
 * then resolves with it; never settles once `stop` aborts (the reply came). What the clients'
 * open-ended waits share: the NATS client re-reading the leader lease, the HTTP client `/readyz`.
 */
export function pollUntil<T>(check: () => Promise<T | undefined>, everyMs: number, stop: AbortSignal, first: "now" | "later"): Promise<T> {
  return new Promise((resolve) => {
    if (stop.aborted) return;
    let timer: NodeJS.Timeout | undefined;
    const run = async () => {
      const found = await check();
      if (stop.aborted) return;
      if (found !== undefined) return resolve(found);
      timer = setTimeout(run, everyMs);
    };
    stop.addEventListener("abort", () => clearTimeout(timer), { once: true });
    if (first === "now") void run();
    else timer = setTimeout(run, everyMs);
  });
}
