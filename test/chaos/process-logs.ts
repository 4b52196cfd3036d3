import { createWriteStream, type WriteStream } from "node:fs";
import { join } from "node:path";

/**
 * Every line every process of one seed printed, timestamped, one file per process plus `all.log`
 * interleaved: a failing seed is read from these, so they are written as lines arrive (a hang or a
 * Ctrl-C still leaves them on disk).
 */
export class ProcessLogs {
  private readonly files = new Map<string, WriteStream>();
  private readonly all: WriteStream;

  constructor(readonly dir: string) {
    this.all = createWriteStream(join(dir, "all.log"));
  }

  /** A line of process `name` (e.g. `coord-a1`, `collector-2`, `gym-environment`). */
  line(name: string, text: string, stream: "stdout" | "stderr" | "harness" = "stdout"): void {
    let file = this.files.get(name);
    if (!file) {
      file = createWriteStream(join(this.dir, `${name}.log`));
      this.files.set(name, file);
    }
    const stamped = `${new Date().toISOString()} ${stream === "stderr" ? "E " : ""}${text}\n`;
    file.write(stamped);
    this.all.write(`${new Date().toISOString()} [${name}]${stream === "stderr" ? " E" : ""} ${text}\n`);
  }

  /** What the harness itself did (faults, restarts, checks), in `harness.log` and `all.log`. */
  note(text: string): void {
    this.line("harness", text, "harness");
  }

  async close(): Promise<void> {
    const streams = [...this.files.values(), this.all];
    await Promise.all(streams.map((s) => new Promise((resolve) => s.end(resolve))));
  }
}
