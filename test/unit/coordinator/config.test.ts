import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { loadConfig, redactConfig } from "../../../coordinator/config/config-loader.js";
import { CheckpointError, connectNats, MAX_DEADLINE_AHEAD_S, natsServers, redactNatsServers } from "../../../protocol/index.js";

describe("coordinator config", () => {
  it("layers defaults < file < env < flags", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-cfg-"));
    try {
      const file = join(dir, "c.json");
      await writeFile(file, JSON.stringify({ deployment: "fromfile", retention: 5, lease_ms: 3000, token: "filetoken", checkpoint_root: "/data/ck", http: { port: 9000 } }));
      const config = loadConfig({
        file,
        env: { GYM_CKPT_DEPLOYMENT: "fromenv", GYM_CKPT_RETENTION: "4", GYM_CKPT_HTTP: "false" },
        flags: { retention: 3 },
      });
      expect(config.deployment).toBe("fromenv");
      expect(config.retention).toBe(3);
      expect(config.lease_ms).toBe(3000);
      expect(config.http).toEqual({ enabled: false, host: "127.0.0.1", port: 9000 });
      expect(config.token).toBe("filetoken");
      expect(config.request_slack_ms).toBe(2000);
      expect(config.request_attempt_ms).toBe(10_000);
      expect(config.request_probe_ms).toBe(1_000);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("an empty --config is refused, not taken for no flag (which would drop GYM_CKPT_CONFIG's file); an empty GYM_CKPT_CONFIG is unset", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-cfg-"));
    try {
      const file = join(dir, "c.json");
      await writeFile(file, JSON.stringify({ token: "filetoken", checkpoint_root: "/data/ck", retention: 7 }));
      expect(() => loadConfig({ file: "", env: { GYM_CKPT_CONFIG: file } })).toThrow(expect.objectContaining({ code: "invalid_request", message: expect.stringContaining("--config") }));
      expect(loadConfig({ env: { GYM_CKPT_CONFIG: file } }).retention).toBe(7);
      expect(loadConfig({ env: { GYM_CKPT_CONFIG: "", GYM_CKPT_TOKEN: "envtoken", GYM_CKPT_CHECKPOINT_ROOT: "/data/ck" } }).retention).toBe(2);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("request_slack_ms is at most 10 minutes: added to a deadline up to 7 days ahead, a timer past 2^31 - 1 ms fires at once", () => {
    const base = { GYM_CKPT_TOKEN: "t", GYM_CKPT_CHECKPOINT_ROOT: "/data/ck" };
    expect(loadConfig({ env: { ...base, GYM_CKPT_REQUEST_SLACK_MS: "600000" } }).request_slack_ms).toBe(600_000);
    expect(() => loadConfig({ env: { ...base, GYM_CKPT_REQUEST_SLACK_MS: "2200000000" } })).toThrow(
      expect.objectContaining({ code: "invalid_request", message: expect.stringMatching(/request_slack_ms[\s\S]*set by:\n  request_slack_ms: GYM_CKPT_REQUEST_SLACK_MS/) }),
    );
  });

  it("request_attempt_ms is 100 to 600000 (10 minutes), as the other timings: a larger one is refused readably, naming where it was set", () => {
    const base = { GYM_CKPT_TOKEN: "t", GYM_CKPT_CHECKPOINT_ROOT: "/data/ck" };
    expect(loadConfig({ env: { ...base, GYM_CKPT_REQUEST_ATTEMPT_MS: "600000" } }).request_attempt_ms).toBe(600_000);
    expect(() => loadConfig({ env: { ...base, GYM_CKPT_REQUEST_ATTEMPT_MS: "600001" } })).toThrow(
      expect.objectContaining({ code: "invalid_request", message: expect.stringMatching(/request_attempt_ms[\s\S]*set by:\n  request_attempt_ms: GYM_CKPT_REQUEST_ATTEMPT_MS/) }),
    );
    expect(() => loadConfig({ env: { ...base, GYM_CKPT_REQUEST_ATTEMPT_MS: "2200000000" } })).toThrow(expect.objectContaining({ code: "invalid_request", message: expect.stringContaining("request_attempt_ms") }));
  });

  it("nats.connect_timeout_ms (GYM_CKPT_NATS_CONNECT_TIMEOUT_MS) is 1 to 600000, nats.js's 20 s by default, as every other process reads it", () => {
    const base = { GYM_CKPT_TOKEN: "t", GYM_CKPT_CHECKPOINT_ROOT: "/data/ck" };
    expect(loadConfig({ env: base }).nats.connect_timeout_ms).toBe(20_000);
    expect(loadConfig({ env: { ...base, GYM_CKPT_NATS_CONNECT_TIMEOUT_MS: "2000" } }).nats.connect_timeout_ms).toBe(2000);
    for (const bad of ["0", "600001", "1.5", "2e3", "soon"]) {
      expect(() => loadConfig({ env: { ...base, GYM_CKPT_NATS_CONNECT_TIMEOUT_MS: bad } }), bad).toThrow(expect.objectContaining({ code: "invalid_request", message: expect.stringContaining("GYM_CKPT_NATS_CONNECT_TIMEOUT_MS") }));
    }
  });

  it("request_probe_ms is 0 (no probes) or at least 100", () => {
    const base = { GYM_CKPT_TOKEN: "t", GYM_CKPT_CHECKPOINT_ROOT: "/data/ck" };
    expect(loadConfig({ env: { ...base, GYM_CKPT_REQUEST_PROBE_MS: "0" } }).request_probe_ms).toBe(0);
    expect(loadConfig({ env: { ...base, GYM_CKPT_REQUEST_PROBE_MS: "250" } }).request_probe_ms).toBe(250);
    expect(() => loadConfig({ env: { ...base, GYM_CKPT_REQUEST_PROBE_MS: "50" } })).toThrow(
      expect.objectContaining({ code: "invalid_request", message: expect.stringContaining("must be 0 (no probes) or at least 100") }),
    );
  });

  it("reports every problem readably and refuses unknown keys", () => {
    let error: unknown;
    try {
      loadConfig({ env: { GYM_CKPT_LEASE_MS: "soon" }, flags: { checkpoint_root: "relative/dir", bogus: 1 } });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(CheckpointError);
    const message = (error as CheckpointError).message;
    expect((error as CheckpointError).code).toBe("invalid_request");
    expect(message).toContain("lease_ms");
    expect(message).toContain("checkpoint_root");
    expect(message).toContain("token");
    expect(message).toContain("bogus");
  });

  it("says how to set a required key nobody set (flag, variable, config file key), not only that it is undefined", () => {
    const message = (() => {
      try {
        loadConfig({ env: {} });
      } catch (error) {
        return (error as CheckpointError).message;
      }
      return "";
    })();
    const unset = message.slice(message.indexOf("not set:"));
    expect(message).toContain("not set:");
    expect(unset).toContain(`token: pass --token or set GYM_CKPT_TOKEN (or "token" in a --config file)`);
    expect(unset).toContain(`checkpoint_root: pass --checkpoint-root or set GYM_CKPT_CHECKPOINT_ROOT (or "checkpoint_root" in a --config file)`);
    // A value that was set but is refused is not "not set": it names its source instead.
    let refused = "";
    try {
      loadConfig({ env: { GYM_CKPT_TOKEN: "t", GYM_CKPT_CHECKPOINT_ROOT: "relative" } });
    } catch (error) {
      refused = (error as CheckpointError).message;
    }
    expect(refused).toContain("checkpoint_root: GYM_CKPT_CHECKPOINT_ROOT");
    expect(refused).not.toContain("not set:");
  });

  it("names where each refused value was set: the variable, the config file, or a flag", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-cfg-"));
    try {
      const file = join(dir, "c.json");
      await writeFile(file, JSON.stringify({ token: "t", checkpoint_root: "/c", lease_ms: "long", http: { port: 70000 } }));
      const message = (() => {
        try {
          loadConfig({ file, env: { GYM_CKPT_RETENTION: "abc", GYM_CKPT_EXPECTED_PARTICIPANTS: "model/m1,nope" }, flags: { default_timeout_ms: -1 } });
        } catch (error) {
          return (error as CheckpointError).message;
        }
        return "";
      })();
      const setBy = message.slice(message.indexOf("set by:"));
      expect(setBy).toContain("retention: GYM_CKPT_RETENTION");
      expect(setBy).toContain("expected_participants.1: GYM_CKPT_EXPECTED_PARTICIPANTS");
      expect(setBy).toContain(`lease_ms: config file ${file}`);
      expect(setBy).toContain(`http.port: config file ${file}`);
      expect(setBy).toContain("default_timeout_ms: a command-line flag");
      // A key nobody set (missing, required) names no source.
      expect(() => loadConfig({ env: { GYM_CKPT_TOKEN: "t" } })).toThrow(expect.objectContaining({ message: expect.not.stringContaining("set by:") }));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });


  it("names the layer that set an unknown key, not one that set another key of its object", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-cfg-"));
    try {
      const file = join(dir, "c.json");
      // The file's typo under nats and http; the environment and a flag set other keys of those objects.
      await writeFile(file, JSON.stringify({ token: "t", checkpoint_root: "/c", nats: { pasword: "x" }, http: { prot: 1 }, retension: 3 }));
      let message = "";
      try {
        loadConfig({ file, env: { GYM_CKPT_NATS_USER: "u" }, flags: { "http.port": 9000, bogus_flag_key: 1 } });
      } catch (error) {
        message = (error as CheckpointError).message;
      }
      const setBy = message.slice(message.indexOf("set by:"));
      expect(message).toContain("set by:");
      expect(setBy).toContain(`nats.pasword: config file ${file}`);
      expect(setBy).toContain(`http.prot: config file ${file}`);
      expect(setBy).toContain(`retension: config file ${file}`);
      expect(setBy).toContain("bogus_flag_key: a command-line flag");
      expect(setBy).not.toContain("the environment");
      expect(setBy).not.toContain("http: a command-line flag");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
  it("refuses a config file's nats or http that is no object also when the environment or a flag sets one of its keys (it was dropped without a word)", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-cfg-"));
    try {
      const file = join(dir, "c.json");
      // A URL where the object goes, `false` for "no HTTP": refused alone; with GYM_CKPT_NATS_USER
      // and --http-port they were replaced, and the daemon went to 127.0.0.1:4222 serving HTTP.
      await writeFile(file, JSON.stringify({ token: "t", checkpoint_root: "/c", nats: "nats://prod.example:4222", http: false }));
      let error: unknown;
      try {
        loadConfig({ file, env: { GYM_CKPT_NATS_USER: "u" }, flags: { "http.port": 9000 } });
      } catch (e) {
        error = e;
      }
      expect((error as CheckpointError | undefined)?.code).toBe("invalid_request");
      const message = (error as Error).message;
      expect(message).toContain("expected object, received string\n  → at nats");
      expect(message).toContain("expected object, received boolean\n  → at http");
      const setBy = message.slice(message.indexOf("set by:"));
      expect(setBy).toContain(`nats: config file ${file}`);
      expect(setBy).toContain(`http: config file ${file}`);
      expect(setBy).not.toContain("a command-line flag");
      expect(setBy).not.toContain("GYM_CKPT_NATS_USER");
      // null is no object either.
      await writeFile(file, JSON.stringify({ token: "t", checkpoint_root: "/c", http: null }));
      expect(() => loadConfig({ file, env: { GYM_CKPT_HTTP_PORT: "9000" } })).toThrow(expect.objectContaining({ code: "invalid_request", message: expect.stringContaining(`http: config file ${file}`) }));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("refuses a config file key __proto__ as unknown, at any level, instead of dropping it", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-cfg-"));
    try {
      for (const [name, text] of [
        ["top.json", '{"token":"t","checkpoint_root":"/data/ck","__proto__":{"retention":7}}'],
        ["nested.json", '{"token":"t","checkpoint_root":"/data/ck","http":{"__proto__":{"port":1}}}'],
      ]) {
        const file = join(dir, name!);
        await writeFile(file, text!);
        let error: unknown;
        try {
          loadConfig({ file, env: {} });
        } catch (e) {
          error = e;
        }
        expect([name, (error as CheckpointError | undefined)?.code, (error as Error | undefined)?.message]).toEqual([name, "invalid_request", expect.stringContaining('Unrecognized key: "__proto__"')]);
      }
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("refuses tokens that could never authenticate reliably (whitespace, control or non-ASCII characters), naming the key", () => {
    for (const [key, env] of [
      ["token", { GYM_CKPT_TOKEN: "two words" }],
      ["token", { GYM_CKPT_TOKEN: "trailing\n" }],
      ["controller_token", { GYM_CKPT_TOKEN: "t", GYM_CKPT_CONTROLLER_TOKEN: "tab\there" }],
      ["controller_token", { GYM_CKPT_TOKEN: "t", GYM_CKPT_CONTROLLER_TOKEN: "café-token" }],
    ] as const) {
      let error: unknown;
      try {
        loadConfig({ env: { ...env, GYM_CKPT_CHECKPOINT_ROOT: "/c" } });
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(CheckpointError);
      expect((error as CheckpointError).code).toBe("invalid_request");
      expect((error as CheckpointError).message).toMatch(new RegExp(`whitespace[^]*→ at ${key}`));
    }
    expect(loadConfig({ env: { GYM_CKPT_TOKEN: "p4ss-w0rd!#", GYM_CKPT_CHECKPOINT_ROOT: "/c" } }).token).toBe("p4ss-w0rd!#");
  });

  it("reads numbers from the environment as decimals only", () => {
    const env = { GYM_CKPT_TOKEN: "t", GYM_CKPT_CHECKPOINT_ROOT: "/c" };
    expect(loadConfig({ env: { ...env, GYM_CKPT_RETENTION: " 4 ", GYM_CKPT_HTTP_PORT: "0" } })).toMatchObject({ retention: 4, http: { port: 0 } });
    for (const [name, value, key] of [
      ["GYM_CKPT_RETENTION", "0x10", "retention"],
      ["GYM_CKPT_LEASE_MS", "1e3", "lease_ms"],
      ["GYM_CKPT_HTTP_PORT", "0b1", "http.port"],
    ]) {
      expect(() => loadConfig({ env: { ...env, [name!]: value } })).toThrow(
        expect.objectContaining({ code: "invalid_request", message: expect.stringContaining(`${key}: ${name} (not a decimal number: "${value}")`) }),
      );
    }
  });

  it("refuses a default_timeout_ms more than 7 days (MAX_DEADLINE_AHEAD_S) long: every op without a deadline would be refused", () => {
    const env = { GYM_CKPT_TOKEN: "t", GYM_CKPT_CHECKPOINT_ROOT: "/c" };
    const cap = MAX_DEADLINE_AHEAD_S * 1000;
    expect(loadConfig({ env, flags: { default_timeout_ms: cap } }).default_timeout_ms).toBe(cap);
    for (const source of [{ env, flags: { default_timeout_ms: cap + 1 } }, { env: { ...env, GYM_CKPT_DEFAULT_TIMEOUT_MS: String(8 * 24 * 3600 * 1000) } }]) {
      expect(() => loadConfig(source)).toThrow(expect.objectContaining({ code: "invalid_request", message: expect.stringContaining("default_timeout_ms") }));
    }
  });

  it("redacts secrets when printed", () => {
    const config = loadConfig({ env: { GYM_CKPT_TOKEN: "s3cret", GYM_CKPT_NATS_PASS: "pw", GYM_CKPT_CHECKPOINT_ROOT: "/c" } });
    const printed = JSON.stringify(redactConfig(config));
    expect(printed).not.toContain("s3cret");
    expect(printed).not.toContain("pw\"");
    expect(printed).toContain("[Redacted]");
    expect(config.token).toBe("s3cret");
  });

  it("redacts credentials inside the NATS server URLs", () => {
    const config = loadConfig({ env: { GYM_CKPT_TOKEN: "t", GYM_CKPT_CHECKPOINT_ROOT: "/c", GYM_CKPT_NATS_URL: "nats://u:hunter2@127.0.0.1:4222,nats://tok3n@127.0.0.2:4222" } });
    const printed = JSON.stringify(redactConfig(config));
    expect(printed).not.toContain("hunter2");
    expect(printed).not.toContain("tok3n");
    // `127.0.0.1:4222,nats://tok3n` might be the rest of the first password: only the last host is kept.
    expect(printed).toContain("nats://[Redacted]@127.0.0.2:4222");
  });

  it("redacts the credentials of every server entry, with or without a scheme", () => {
    const servers = "nats://u:s3cret@h:1,user2:pw2@h2:4222, tls://t0k@h3:4222,h4:4222,nats://u:p@ss/w@h5";
    const config = loadConfig({ env: { GYM_CKPT_TOKEN: "t", GYM_CKPT_CHECKPOINT_ROOT: "/c", GYM_CKPT_NATS_URL: servers } });
    const printed = (redactConfig(config).nats as { servers: string }).servers;
    for (const secret of ["s3cret", "user2", "pw2", "t0k", "ss/w"]) expect(printed).not.toContain(secret);
    expect(printed).toBe("nats://[Redacted]@h5");
  });

  it("redacts a token in a NATS server URL's query, in --print-config and in the connection refusal", async () => {
    // nats.js takes `nats://host:port/?token=…` (and ignores the query): it was printed as given.
    const servers = "nats://127.0.0.1:4999/?token=Qu3ryT0ken";
    const config = loadConfig({ env: { GYM_CKPT_TOKEN: "t", GYM_CKPT_CHECKPOINT_ROOT: "/c", GYM_CKPT_NATS_URL: servers } });
    const printed = (redactConfig(config).nats as { servers: string }).servers;
    expect(printed).toBe("nats://127.0.0.1:4999/?[Redacted]");
    for (const bad of [servers, "nats://127.0.0.1:SECRETPORT?token=Qu3ryT0ken"]) {
      const refusal = await connectNats({ servers: natsServers(bad), inboxPrefix: "_INBOX", timeout: 2_000, reconnect: false }, { unreachable: "not_leader", consequence: "test" }).then(
        (nc) => nc.close().then(() => "connected"),
        (error: Error) => error.message,
      );
      expect(refusal).toMatch(/^cannot (reach|connect to) NATS at nats:\/\/127\.0\.0\.1:/);
      expect(refusal).not.toContain("Qu3ryT0ken");
    }
  });

  it("redacts a password holding a comma, which splits its URL into two entries of the list", async () => {
    // `nats://coordinator:S3cr,etPW@host` is the entries `nats://coordinator:S3cr` and `etPW@host`:
    // only the second was redacted, so --print-config and the start-up refusal printed `S3cr`.
    const servers = "nats://coordinator:S3cr,etPW@127.0.0.1:4999";
    const config = loadConfig({ env: { GYM_CKPT_TOKEN: "t", GYM_CKPT_CHECKPOINT_ROOT: "/c", GYM_CKPT_NATS_URL: servers } });
    const printed = (redactConfig(config).nats as { servers: string }).servers;
    expect(printed).not.toContain("S3cr");
    expect(printed).toBe("nats://[Redacted]@127.0.0.1:4999");
    // Where a credential starts is unknown (`h0:4222,u:a,b,c` may be one): up to the last @ goes; later servers are kept.
    expect(redactNatsServers("nats://h0:4222,u:a,b,c@h1:4222,nats://h2:4222")).toBe("nats://[Redacted]@h1:4222,nats://h2:4222");
    expect(redactNatsServers("nats://u:p@h1:4222,nats://h2:4222")).toBe("nats://[Redacted]@h1:4222,nats://h2:4222");
    // The start-up refusal names the servers the same way.
    const refusal = await connectNats({ servers: natsServers(servers), inboxPrefix: "_INBOX", timeout: 2_000, reconnect: false }, { unreachable: "not_leader", consequence: "test" }).then(
      (nc) => nc.close().then(() => "connected"),
      (error: Error) => error.message,
    );
    expect(refusal).not.toContain("S3cr");
    expect(refusal).toContain("NATS at nats://[Redacted]@127.0.0.1:4999");
  });

  it("does not echo a config file's text when it is not JSON (it may quote a secret)", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-cfg-"));
    const file = join(dir, "c.json");
    await writeFile(file, '{"token": SUPERSECRET123, "checkpoint_root": "/c"}');
    try {
      expect(() => loadConfig({ file, env: {} })).toThrow(CheckpointError);
      expect(() => loadConfig({ file, env: {} })).not.toThrow(/SUPERSECRE/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
  it("refuses a config file that names a key twice in one object, naming the key (JSON.parse would keep the last silently)", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-cfg-"));
    const file = join(dir, "c.json");
    await writeFile(file, '{"token": "FIRSTSECRET", "checkpoint_root": "/c", "nats": {"servers": "nats://a:4222", "servers": "nats://b:4222"}, "token": "SECONDSECRET"}');
    try {
      expect(() => loadConfig({ file, env: {} })).toThrow(/^config file .*c\.json names the key "(token|servers)" twice in one object$/);
      expect(() => loadConfig({ file, env: {} })).not.toThrow(/SECRET/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("refuses a config file that is not UTF-8 instead of reading its bytes as U+FFFD (another checkpoint_root)", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-cfg-"));
    const file = join(dir, "c.json");
    await writeFile(file, Buffer.concat([Buffer.from('{"token": "t", "checkpoint_root": "/srv/ck'), Buffer.from([0xff]), Buffer.from('"}')]));
    try {
      expect(() => loadConfig({ file, env: {} })).toThrow(/^config file .*c\.json is not valid UTF-8$/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("reads a config file that starts with a UTF-8 byte order mark (as some editors save it)", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-cfg-"));
    const file = join(dir, "c.json");
    await writeFile(file, '\ufeff{"token": "t", "checkpoint_root": "/srv/ck"}');
    try {
      expect(loadConfig({ file, env: {} }).checkpoint_root).toBe("/srv/ck");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("expected_participants: file, env (comma-separated) or flag; kind/instance each once, else refused", async () => {
    const base = { GYM_CKPT_TOKEN: "t", GYM_CKPT_CHECKPOINT_ROOT: "/c" };
    expect(loadConfig({ env: base }).expected_participants).toBeUndefined();
    expect(loadConfig({ env: { ...base, GYM_CKPT_EXPECTED_PARTICIPANTS: "resources/r1, model/policy" } }).expected_participants).toEqual(["resources/r1", "model/policy"]);
    expect(loadConfig({ env: { ...base, GYM_CKPT_EXPECTED_PARTICIPANTS: "resources/r1" }, flags: { expected_participants: ["environment/env1"] } }).expected_participants).toEqual([
      "environment/env1",
    ]);
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-cfg-"));
    try {
      const file = join(dir, "c.json");
      await writeFile(file, JSON.stringify({ token: "t", checkpoint_root: "/c", expected_participants: ["agent/a1"] }));
      expect(loadConfig({ file, env: {} }).expected_participants).toEqual(["agent/a1"]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
    for (const bad of [["resource/r1"], ["resources"], ["resources/../x"], ["resources/r1/x"], ["resources/r1", "resources/r1"], "resources/r1"]) {
      let error: unknown;
      try {
        loadConfig({ env: base, flags: { expected_participants: bad } });
      } catch (e) {
        error = e;
      }
      expect(error, JSON.stringify(bad)).toBeInstanceOf(CheckpointError);
      expect((error as CheckpointError).code).toBe("invalid_request");
      expect((error as CheckpointError).message).toContain("expected_participants");
    }
  });
});
