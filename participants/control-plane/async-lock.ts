/** A FIFO mutex: one control transition at a time, in arrival order. */
export class AsyncLock {
  private tail: Promise<void> = Promise.resolve();
  /** Runs holding or waiting for the lock. */
  private pending = 0;

  /** Nobody holds the lock or waits for it: a caller may run a synchronous section at once. */
  get idle(): boolean {
    return this.pending === 0;
  }

  async run<T>(fn: () => Promise<T> | T): Promise<T> {
    const previous = this.tail;
    let release!: () => void;
    this.tail = new Promise<void>((resolve) => (release = resolve));
    this.pending += 1;
    await previous;
    try {
      return await fn();
    } finally {
      this.pending -= 1;
      release();
    }
  }
}
