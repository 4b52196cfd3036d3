import { parseArgs } from "node:util";
import { describe, expect, it } from "vitest";
import { ATTACH_SECRET_FLAGS, GYM_SECRET_FLAGS, secretFlagsToEnv as forward } from "../../../coordinator/local/secret-flags-to-env.js";

const secretFlagsToEnv = (args: string[]) => forward(args, GYM_SECRET_FLAGS);

/** What the participant program reads: its flag, else the variable (as server-runtime.ts and gym/main.ts do). */
function programSees(args: string[], env: Record<string, string>): { nats?: string; token?: string } {
  const { values } = parseArgs({ args, strict: true, options: { nats: { type: "string" }, token: { type: "string" }, deployment: { type: "string" } } });
  return { nats: values.nats ?? env.GYM_CKPT_NATS_URL, token: values.token ?? env.GYM_CKPT_TOKEN };
}

describe("secretFlagsToEnv: --nats and --token leave the command line for the environment", () => {
  it.each([
    [["--nats", "nats://u:p@h:1", "--deployment", "d", "--token", "t0k"]],
    [["--nats=nats://h:1/?token=s3", "--token=t0k"]],
    [["--nats", "nats://a:1", "--nats", "nats://b:2"]],
    [["--token", "first", "--token=second", "--deployment", "d"]],
  ])("%j: the program sees the same values, none of them in argv", (args) => {
    const forwarded = secretFlagsToEnv(args);
    expect(programSees(forwarded.args, forwarded.env)).toEqual(programSees(args, {}));
    expect(forwarded.args.filter((arg) => arg.startsWith("--nats") || arg.startsWith("--token"))).toEqual([]);
  });

  it("overrides an inherited variable, as the flag beat it", () => {
    expect(secretFlagsToEnv(["--nats", "nats://flag:1"]).env).toEqual({ GYM_CKPT_NATS_URL: "nats://flag:1" });
  });

  it("leaves what the program refuses for it to refuse: no value, an empty one, one beginning with a dash", () => {
    expect(secretFlagsToEnv(["--deployment", "d", "--nats"])).toEqual({ args: ["--deployment", "d", "--nats"], env: {} });
    expect(secretFlagsToEnv(["--nats="])).toEqual({ args: ["--nats="], env: {} });
    expect(secretFlagsToEnv(["--token", ""])).toEqual({ args: ["--token", ""], env: {} });
    expect(secretFlagsToEnv(["--nats", "--token", "t"])).toEqual({ args: ["--nats"], env: { GYM_CKPT_TOKEN: "t" } });
    expect(secretFlagsToEnv(["--nats=-x"])).toEqual({ args: [], env: { GYM_CKPT_NATS_URL: "-x" } });
  });

  it("attach: --cut-token goes too, unless the proxy would refuse it: then every --cut-token stays, so its refusal names the flag", () => {
    expect(forward(["--cut-token", "c0t", "--token", "t"], ATTACH_SECRET_FLAGS)).toEqual({ args: [], env: { GYM_CKPT_CUT_TOKEN: "c0t", GYM_CKPT_TOKEN: "t" } });
    expect(forward(["--cut-token=bad token"], ATTACH_SECRET_FLAGS)).toEqual({ args: ["--cut-token=bad token"], env: {} });
    // Moved, the good one would be overridden by the bad one still on the command line, which parseArgs took for the earlier.
    expect(forward(["--cut-token", "bad\ttoken", "--cut-token", "good"], ATTACH_SECRET_FLAGS)).toEqual({ args: ["--cut-token", "bad\ttoken", "--cut-token", "good"], env: {} });
    // Not the Gym's flag: it stays for gym-ckpt gym to refuse as unknown.
    expect(secretFlagsToEnv(["--cut-token", "c0t"])).toEqual({ args: ["--cut-token", "c0t"], env: {} });
  });

  it("moves nothing after --, and no other flag (--token-delay-ms, --nats-connect-wait-ms)", () => {
    const args = ["--token-delay-ms", "5", "--nats-connect-wait-ms=0", "--", "--nats", "x"];
    expect(secretFlagsToEnv(args)).toEqual({ args, env: {} });
  });
});
