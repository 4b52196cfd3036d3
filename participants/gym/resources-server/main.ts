import { CheckpointModeSchema, CheckpointVerifySchema, createResourcesApp, ownerRefusal, type ResourcesServer } from "../../kinds/resources/index.js";
import { startServerRuntime } from "../server-runtime.js";
import { CalculatorServer, calculatorServerClass } from "./calculator-server.js";
import { CounterServer } from "./counter-server.js";

/**
 * The reference resources server process.
 *   --server calculator (default) | counter
 *   --mode stateless (calculator default) | restart_only | exported (counter only)
 *   --verify replay (calculator default) | wait
 *   --owner <routing id written into records>
 *   --replayable-end-hold-ms <ms> how long a session a replayable /verify ended stays held for a
 *     checkpoint that may be under way (default 60000, the coordinator's default op deadline)
 *   --unused-seed-lifetime-ms <ms> how long a seeded session no request names lives (its seed reply
 *     may have been lost; default 3600000, 0: for ever)
 */
function buildServer(extra: Record<string, string | undefined>): ResourcesServer {
  const which = extra.server ?? "calculator";
  if (which === "counter") {
    if (extra.mode !== undefined && extra.mode !== "exported") throw new Error("the counter server is declared exported");
    if (extra.verify !== undefined && extra.verify !== "wait") throw new Error("the counter server's /verify is declared wait (it ends the counter it reads)");
    return new CounterServer();
  }
  if (which !== "calculator") throw new Error(`unknown --server ${which}`);
  // One line naming the flag, not a zod issue list printed as JSON.
  const mode = CheckpointModeSchema.safeParse(extra.mode ?? CalculatorServer.checkpointMode);
  if (!mode.success) throw new Error(`--mode must be one of ${CheckpointModeSchema.options.join(", ")}`);
  const verify = CheckpointVerifySchema.safeParse(extra.verify ?? CalculatorServer.checkpointVerify);
  if (!verify.success) throw new Error(`--verify must be one of ${CheckpointVerifySchema.options.join(", ")}`);
  if (mode.data === "exported") throw new Error("the calculator server has no session state to export; use --mode stateless or restart_only");
  const Server = calculatorServerClass(mode.data, verify.data);
  return new Server();
}

// The flags are checked before NATS (a configuration error is exit 2 also while NATS is down).
const runtime = await startServerRuntime("resources-server", process.argv.slice(2), ["server", "mode", "verify", "owner", "replayable-end-hold-ms", "unused-seed-lifetime-ms"], (extra) => {
  try {
    buildServer(extra);
  } catch (error) {
    return error instanceof Error ? error.message : String(error);
  }
  return ownerRefusal(extra.owner ?? null);
});
const { extra, logger } = runtime;

let server: ResourcesServer;
let built: Awaited<ReturnType<typeof createResourcesApp>>;
try {
  server = buildServer(extra);
  const hold = extra["replayable-end-hold-ms"];
  const lifetime = extra["unused-seed-lifetime-ms"];
  built = await createResourcesApp(server, {
    owner: extra.owner ?? null,
    logger,
    ...(hold !== undefined && { replayableEndHoldMs: Number(hold) }),
    ...(lifetime !== undefined && { unusedSeedLifetimeMs: Number(lifetime) }),
  });
} catch (error) {
  process.stderr.write(`resources-server: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exit(2);
}
const { app, kind } = built;
if (server instanceof CalculatorServer) server.controls.routes(app);
if (server instanceof CounterServer) app.get("/admin/counters", async () => ({ counters: Object.fromEntries(server.counters), parked: server.parked }));
app.get("/health", async () => ({ ok: true, mode: kind.mode, verify: kind.verify }));
const address = await runtime.serve(app, kind);
logger.info({ url: address, mode: kind.mode, verify: kind.verify }, "resources server listening");
