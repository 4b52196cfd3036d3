import { describe, expect, it } from "vitest";
import { CheckpointError } from "../../../protocol/index.js";
import { LedgerOutage } from "../../../participants/kinds/model/ledger-outage.js";

const enospc = () => Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC", errno: -28, syscall: "write", path: "/ledger/k.lineage.jsonl" });

/** A probe that fails while `full` and counts its calls. */
function storage() {
  const disk = { full: true, probes: 0 };
  const probe = async () => {
    disk.probes += 1;
    await Promise.resolve();
    if (disk.full) throw enospc();
  };
  return { disk, probe };
}

const refusalOf = (promise: Promise<unknown>) =>
  promise.then(
    () => undefined,
    (error: unknown) => (error instanceof CheckpointError ? error.code : String(error)),
  );

describe("LedgerOutage", () => {
  it("admits without probing while no row's write failed", async () => {
    const { disk, probe } = storage();
    const outage = new LedgerOutage("/ledger", probe, 0, undefined);
    await outage.admit();
    expect(disk.probes).toBe(0);
  });

  it("is not begun by a failure that is not the storage's", async () => {
    const { disk, probe } = storage();
    const outage = new LedgerOutage("/ledger", probe, 60_000, undefined);
    outage.failed(new Error("a bug"));
    outage.failed(Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED", syscall: "connect" }));
    await outage.admit();
    expect(disk.probes).toBe(0);
  });

  it("refuses with storage_error naming the system error, without probing again within the interval", async () => {
    const { disk, probe } = storage();
    const outage = new LedgerOutage("/ledger", probe, 60_000, undefined);
    outage.failed(enospc());
    const refused = await outage.admit().catch((error: unknown) => error as CheckpointError);
    expect(refused).toBeInstanceOf(CheckpointError);
    expect((refused as CheckpointError).code).toBe("storage_error");
    expect((refused as CheckpointError).status).toBe(507);
    expect((refused as CheckpointError).message).toContain("ENOSPC on write");
    // The directory, not the file of the call that failed: another rollout's capture key.
    expect((refused as CheckpointError).message).toContain("/ledger");
    expect((refused as CheckpointError).message).not.toContain("k.lineage.jsonl");
    disk.full = false;
    expect(await refusalOf(outage.admit())).toBe("storage_error");
    expect(disk.probes).toBe(0);
  });

  it("shares one probe among the calls arriving while it runs, and ends the outage when it succeeds", async () => {
    const { disk, probe } = storage();
    const outage = new LedgerOutage("/ledger", probe, 0, undefined);
    outage.failed(enospc());
    expect(await Promise.all([refusalOf(outage.admit()), refusalOf(outage.admit()), refusalOf(outage.admit())])).toEqual(["storage_error", "storage_error", "storage_error"]);
    expect(disk.probes).toBe(1);
    disk.full = false;
    expect(await Promise.all([refusalOf(outage.admit()), refusalOf(outage.admit())])).toEqual([undefined, undefined]);
    expect(disk.probes).toBe(2);
    // Over: later calls are admitted without a probe.
    await outage.admit();
    expect(disk.probes).toBe(2);
  });

  it("keeps the outage when a row's write fails while a probe that then succeeds was running", async () => {
    let finish!: () => void;
    let probes = 0;
    const outage = new LedgerOutage("/ledger", () => (probes++, new Promise<void>((resolve) => (finish = resolve))), 0, undefined);
    outage.failed(enospc());
    const admitting = refusalOf(outage.admit());
    await Promise.resolve();
    outage.failed(enospc()); // another row's write, during the probe
    finish();
    expect(await admitting).toBe("storage_error");
    expect(outage.refusing).toMatch(/ENOSPC/);
    const next = outage.admit();
    finish();
    await next;
    expect(probes).toBe(2);
    expect(outage.refusing).toBeNull();
  });

  it("probes again once the interval since the last failure has passed", async () => {
    const { disk, probe } = storage();
    const outage = new LedgerOutage("/ledger", probe, 30, undefined);
    outage.failed(enospc());
    disk.full = false;
    expect(await refusalOf(outage.admit())).toBe("storage_error");
    const since = performance.now();
    while (performance.now() - since < 40) await new Promise((resolve) => setTimeout(resolve, 10));
    await outage.admit();
    expect(disk.probes).toBe(1);
  });
});
