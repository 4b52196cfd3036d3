import type { Command } from "commander";
import type { CtlReplyOf } from "../../../protocol/index.js";
import { printJson, withClient, withClientOptions, type ClientFlags } from "../shared.js";

/** A plain-text table of participants: kind, instance, phase, lease, blockers. */
export function statusTable(reply: CtlReplyOf<"status">, nowMs = Date.now()): string {
  const rows = [["KIND", "INSTANCE", "PHASE", "LEASE", "BLOCKERS"]];
  for (const p of reply.participants) {
    const lease = p.lease_expires_at === null ? "-" : `${Math.max(0, Math.round(p.lease_expires_at - nowMs / 1000))}s`;
    const phase = p.phase ?? (p.error ? p.error.code : "-");
    const blockers = p.blocker_count ? `${p.blocker_count}: ${p.blockers.slice(0, 5).join(",")}${p.blocker_count > 5 ? ",…" : ""}` : "-";
    rows.push([p.kind, p.instance, phase, lease, blockers]);
  }
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  const lines = rows.map((r) => r.map((cell, i) => cell.padEnd(widths[i]!)).join("  ").trimEnd());
  const c = reply.coordinator;
  const head = `deployment ${reply.deployment}  coordinator ${c.id} ${c.leader ? `leader epoch ${c.epoch}${c.ready ? "" : " (waiting)"}` : "follower"}  checkpoint ${reply.checkpoint ? `${reply.checkpoint.checkpoint_id} (${reply.checkpoint.phase})` : "-"}`;
  return `${head}\n${lines.join("\n")}\n`;
}

export function register(program: Command): void {
  withClientOptions(program.command("status").description("participants: kind, instance, phase, lease, blockers")).action(async (flags: ClientFlags) => {
    await withClient(flags, async (client) => {
      const reply = await client.status();
      if (flags.json) printJson(reply);
      else process.stdout.write(statusTable(reply));
    });
  });
}
