/**
 * The last N checkpoint ids that were resumed (or aborted before their prepare arrived).
 * A delayed call for one of them is refused with `stale_checkpoint`.
 */
export class ResumedFence {
  private readonly ids = new Set<string>();

  constructor(private readonly capacity = 64) {}

  has(id: string): boolean {
    return this.ids.has(id);
  }

  add(id: string): void {
    this.ids.delete(id);
    this.ids.add(id);
    while (this.ids.size > this.capacity) {
      const oldest = this.ids.values().next().value as string;
      this.ids.delete(oldest);
    }
  }
}
