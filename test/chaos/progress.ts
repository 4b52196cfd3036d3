import { readFile } from "node:fs/promises";
import type { FaultRecord } from "./faults.js";

/**
 * Watches results.jsonl for rows finishing, to report the longest stretch with none: the cost of a
 * fault in time (a failover, a lease waited out, a restore) shows there even when every invariant
 * holds.
 */
export class ProgressWatch {
  private readonly finishes: number[] = [];
  private lines = 0;
  private timer?: NodeJS.Timeout;

  constructor(
    private readonly out: string,
    private readonly t0: number,
  ) {}

  start(): void {
    this.timer = setInterval(() => void this.poll(), 250);
  }

  private async poll(): Promise<void> {
    const text = await readFile(this.out, "utf8").catch(() => "");
    const count = text.split("\n").filter((l) => l.trim()).length;
    const now = Date.now() - this.t0;
    for (; this.lines < count; this.lines++) this.finishes.push(now);
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.poll();
  }

  /** The longest gap (from the start, between finishes, or to the end), with the faults active in it. */
  longestGap(endMs: number, faults: FaultRecord[]): { fromMs: number; toMs: number; faults: string[] } {
    const points = [0, ...this.finishes, endMs];
    let best = { fromMs: 0, toMs: 0 };
    for (let i = 1; i < points.length; i++) if (points[i]! - points[i - 1]! > best.toMs - best.fromMs) best = { fromMs: points[i - 1]!, toMs: points[i]! };
    // Active around it: began before the gap ended and ended after it began (or never ended).
    const active = faults.filter((f) => f.startMs <= best.toMs && (f.endMs ?? Infinity) >= best.fromMs - 1000).map((f) => f.label);
    return { ...best, faults: active };
  }
}
