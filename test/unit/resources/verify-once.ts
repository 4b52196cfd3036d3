import { createResourcesApp, type ResourcesServer } from "../../../participants/kinds/resources/index.js";

/** The sandbox limits the code verifier tests run with (a case gets 1 s: the machines are shared). */
export const CODE_LIMITS = { memoryMb: 48, caseTimeoutMs: 1000, startupMs: 4000, maxCaseOutputChars: 64 * 1024 };

/** One `/verify` of `payload` on a fresh resources app over `server`, closed after: its status and body. */
export async function verifyOnce(server: ResourcesServer, payload: object): Promise<{ status: number; body: any }> {
  const { app } = await createResourcesApp(server);
  try {
    const reply = await app.inject({ method: "POST", url: "/ng-rollout/r1/verify", payload });
    return { status: reply.statusCode, body: reply.json() };
  } finally {
    await app.close();
  }
}
