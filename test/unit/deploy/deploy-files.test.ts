import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { parseDocument } from "yaml";
import { buildProgram } from "../../../coordinator/cli/program.js";
import { CONFIG_ENV } from "../../../coordinator/config/config-loader.js";
import { controllerSubject, journalBucket, leaderBucket, MAX_CONTROL_MESSAGE_BYTES, membersBucket, NATS_INBOX_PREFIXES, NATS_OP_REPLY_PREFIX, participantSubject } from "../../../protocol/index.js";

/**
 * deploy/ never runs in the suite (no Docker daemon or cluster): its YAML must parse, the
 * configuration of every coordinator it starts must load through the CLI, and the rules
 * docs/operations.md states hold.
 */
const DEPLOY = fileURLToPath(new URL("../../../deploy", import.meta.url));
const ROOT = join(DEPLOY, "..");

function files(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) =>
    entry.isDirectory() ? files(join(dir, entry.name)) : [join(dir, entry.name)],
  );
}

// Manifests are walked by known paths; a missing one fails the test.
type Yaml = any;

function yamlFile(path: string): Yaml {
  // Compose uses `<<` merge keys (YAML 1.1); they are off by default in YAML 1.2.
  const doc = parseDocument(readFileSync(path, "utf8"), { merge: true, uniqueKeys: true });
  expect([...doc.errors, ...doc.warnings].map((e) => e.message), relative(DEPLOY, path)).toEqual([]);
  return doc.toJS();
}

describe("deploy/ files", () => {
  it("every YAML file parses", () => {
    const yamls = files(DEPLOY).filter((path) => /\.ya?ml$/.test(path));
    expect(yamls.length).toBeGreaterThanOrEqual(6);
    for (const path of yamls) expect(yamlFile(path), relative(DEPLOY, path)).toBeTypeOf("object");
  });

  it("the kustomization lists files that exist", () => {
    const base = join(DEPLOY, "kubernetes/base");
    const kustomization = yamlFile(join(base, "kustomization.yaml"));
    for (const resource of kustomization.resources) expect(files(base)).toContain(join(base, resource));
    for (const generator of kustomization.configMapGenerator) for (const file of generator.files) expect(files(base)).toContain(join(base, file));
  });

  it("a coordinator rollout cannot wait for a standby to become ready", () => {
    const spec = yamlFile(join(DEPLOY, "kubernetes/base/deployment.yaml")).spec;
    expect(spec.template.spec.containers[0].readinessProbe.httpGet.path).toBe("/readyz");
    // Readiness = leadership: a new pod stands by while the old leader lives, so the old pods
    // must all go without waiting for a new one to become Ready.
    if (spec.strategy.type !== "Recreate") expect(spec.strategy.rollingUpdate.maxUnavailable).toBe("100%");
  });

  it("metrics leave one way: containers whose metrics Prometheus scrapes export only traces over OTLP", () => {
    const container = yamlFile(join(DEPLOY, "kubernetes/base/deployment.yaml")).spec.template.spec.containers[0];
    const names = (container.env as { name: string }[]).map((e) => e.name);
    expect(container.args).toContain("--metrics-port");
    expect(names).toContain("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    expect(names).not.toContain("OTEL_EXPORTER_OTLP_ENDPOINT");
    expect(names).not.toContain("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
    const compose = yamlFile(join(DEPLOY, "docker-compose.yml"));
    expect(JSON.stringify(compose)).not.toMatch(/OTEL_EXPORTER_OTLP_(METRICS_)?ENDPOINT/);
    // The systemd unit too, its commented-out suggestions included: an operator uncomments them as written.
    const unit = readFileSync(join(DEPLOY, "systemd/gym-ckpt-coordinator.service"), "utf8");
    expect(/^ExecStart=.*--metrics-port/m.test(unit)).toBe(true);
    const environment = [...unit.matchAll(/^#?\s*Environment=(\w+)=/gm)].map((m) => m[1]);
    expect(environment).not.toContain("OTEL_EXPORTER_OTLP_ENDPOINT");
    expect(environment).not.toContain("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
  });

  it("compose publishes ports on loopback only, passes no token in a command, and keeps the attach ledger on a volume", () => {
    const path = join(DEPLOY, "docker-compose.yml");
    // Not even in the usage comment: a host shell expands it and the process arguments show it.
    expect(readFileSync(path, "utf8")).not.toContain("--token");
    const compose = yamlFile(path);
    for (const [name, service] of Object.entries<Yaml>(compose.services)) {
      for (const port of service.ports ?? []) expect(port, name).toMatch(/^127\.0\.0\.1:\d+:\d+$/);
      expect(service.restart, name).toBe("unless-stopped");
    }
    const model = compose.services["gym-model"];
    const ledgerDir = model.command[model.command.indexOf("--ledger-dir") + 1];
    expect(model.volumes.map((v: string) => v.split(":")[1])).toContain(ledgerDir);
  });

  it("the image tag the Dockerfile, the Kubernetes base and docs/operations.md name is package.json's version", () => {
    const { version } = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { version: string };
    const tags = (text: string) => [...text.matchAll(/\bgym-ckpt:(\d[\w.+-]*\w)/g)].map((m) => m[1]);
    const named: [string, string][] = [
      ["deploy/Dockerfile", readFileSync(join(DEPLOY, "Dockerfile"), "utf8")],
      ["deploy/kubernetes/base/deployment.yaml", readFileSync(join(DEPLOY, "kubernetes/base/deployment.yaml"), "utf8")],
      ["docs/operations.md", readFileSync(join(ROOT, "docs/operations.md"), "utf8")],
    ];
    for (const [where, text] of named) {
      expect(tags(text).length, where).toBeGreaterThan(0);
      for (const tag of tags(text)) expect(tag, where).toBe(version);
    }
    expect(yamlFile(join(DEPLOY, "kubernetes/base/deployment.yaml")).spec.template.spec.containers[0].image).toBe(`gym-ckpt:${version}`);
  });

  it("the image's build copies every directory the build compiles, and .dockerignore keeps none of them out", () => {
    const dockerfile = readFileSync(join(DEPLOY, "Dockerfile"), "utf8");
    const build = dockerfile.split(/^FROM /m)[1]!;
    const copied = [...build.matchAll(/^COPY (?!--from)(.+)$/gm)].flatMap((m) => m[1]!.trim().split(/\s+/).slice(0, -1));
    const { include } = JSON.parse(readFileSync(join(ROOT, "tsconfig.build.json"), "utf8")) as { include: string[] };
    for (const dir of include) expect(copied, `tsconfig.build.json compiles ${dir}`).toContain(dir);
    // `npm run build`'s second step.
    expect(JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")).scripts.build).toContain("node deploy/bundle-entries.mjs");
    expect(copied).toContain("deploy/bundle-entries.mjs");
    // Plain patterns only: a path the ignore file names (or lies under) never reaches the build.
    const ignored = readFileSync(join(ROOT, ".dockerignore"), "utf8")
      .split("\n")
      .map((line) => line.trim())
      .filter((line) => line !== "" && !line.startsWith("#"));
    for (const path of copied) {
      for (const pattern of ignored) {
        const plain = pattern.replace(/^\*\*\//, "");
        if (/[*?[!]/.test(plain)) continue;
        expect(path === plain || path.startsWith(`${plain}/`) || path.split("/").includes(plain), `.dockerignore ${pattern} drops ${path}`).toBe(false);
      }
      expect(existsSync(join(ROOT, path)), path).toBe(true);
    }
  });

  it("both nats-server configs run JetStream with the default 1 MiB max_payload", () => {
    for (const name of ["nats-server.conf", "nats-server.production.conf"]) {
      const conf = readFileSync(join(DEPLOY, "nats", name), "utf8");
      expect(conf, name).toMatch(/^jetstream \{/m);
      // What control messages and replies are sized against (a smaller limit refuses large lists and
      // replies; a larger one is not what the coordinator assumes). nats-server reads MB as 1024 * 1024.
      const payload = /^max_payload:\s*(\d+)\s*(MB|KB)?\b/m.exec(conf);
      expect(payload, `${name}: max_payload`).not.toBeNull();
      const bytes = Number(payload![1]) * { MB: 1024 * 1024, KB: 1024, none: 1 }[payload![2] ?? "none"]!;
      expect(bytes, `${name}: max_payload`).toBe(MAX_CONTROL_MESSAGE_BYTES);
    }
  });

  it("the production NATS template's permissions name the buckets, subjects and inboxes of the deployment the Kubernetes base runs", () => {
    const conf = readFileSync(join(DEPLOY, "nats/nats-server.production.conf"), "utf8");
    const { deployment } = JSON.parse(readFileSync(join(DEPLOY, "kubernetes/base/config.json"), "utf8")) as { deployment: string };
    for (const bucket of [membersBucket(deployment), leaderBucket(deployment), journalBucket(deployment)]) {
      expect(conf, bucket).toContain(`"$JS.API.STREAM.INFO.KV_${bucket}"`);
      expect(conf, bucket).toContain(`"$JS.API.DIRECT.GET.KV_${bucket}.>"`);
    }
    expect(conf).toContain(`"$KV.${leaderBucket(deployment)}.>"`);
    expect(conf).toContain(`"$KV.${journalBucket(deployment)}.>"`);
    expect(conf).toContain(`"$KV.${membersBucket(deployment)}.>"`);
    const participants = participantSubject(deployment, "environment", "e", "status").replace(/\.environment\.e\.status$/, ".>");
    const controller = controllerSubject(deployment, "x").replace(/\.x$/, ".>");
    expect(conf).toContain(`"${participants}"`);
    expect(conf).toContain(`"${controller}"`);
    for (const prefix of [...Object.values(NATS_INBOX_PREFIXES), NATS_OP_REPLY_PREFIX]) expect(conf, prefix).toContain(`"${prefix}.>"`);
    // The coordinator's NATS user, in the Secret the kustomization's comment creates, is the template's.
    const kustomization = readFileSync(join(DEPLOY, "kubernetes/base/kustomization.yaml"), "utf8");
    const user = /--from-literal=GYM_CKPT_NATS_USER=(\w+)/.exec(kustomization)![1]!;
    expect(conf).toMatch(new RegExp(`\\{ user: ${user}, password: \\$\\w+, permissions: \\$COORDINATOR_PERMISSIONS \\}`));
  });

  it("the systemd unit creates its state directory and does not restart a configuration error (exit 2)", () => {
    const unit = readFileSync(join(DEPLOY, "systemd/gym-ckpt-coordinator.service"), "utf8");
    expect(unit).toMatch(/^StateDirectory=gym-ckpt$/m);
    expect(unit).toMatch(/^RestartPreventExitStatus=2$/m);
    expect(unit).not.toMatch(/^ReadWritePaths=/m);
  });

  it("the systemd install copies what the image runs (package.json included) and the docs the unit names", () => {
    // The image's runtime stage: `COPY --from=build /app/<what> …`.
    const dockerfile = readFileSync(join(DEPLOY, "Dockerfile"), "utf8");
    const runtime = [...dockerfile.matchAll(/^COPY --from=build \/app\/(\S+)/gm)].map((m) => m[1]!);
    expect(runtime.sort()).toEqual(["dist", "node_modules", "package.json"]);
    // Without package.json's `"type": "module"`, Node before 20.19 reads dist/ as CommonJS and the unit
    // fails at its first `import` (exit 1, restarted every 2 s).
    const unit = readFileSync(join(DEPLOY, "systemd/gym-ckpt-coordinator.service"), "utf8");
    const operations = readFileSync(join(ROOT, "docs/operations.md"), "utf8");
    const installed = (where: string, text: string, pattern: RegExp) => {
      const list = pattern.exec(text)?.[1];
      expect(list, `${where} lists what goes to /opt/gym-ckpt`).toBeDefined();
      return list!.split(/,\s*/).map((item) => item.replace(/\/$/, ""));
    };
    const fromUnit = installed("the unit", unit, /the build to \/opt\/gym-ckpt \(([^);]*)/);
    const fromDocs = installed("docs/operations.md", operations, /\/opt\/gym-ckpt: the build \(([^);]*)/);
    for (const what of runtime) {
      expect(fromUnit, `the unit's install: ${what}`).toContain(what);
      expect(fromDocs, `docs/operations.md: ${what}`).toContain(what);
    }
    const documentation = /^Documentation=file:\/\/\/opt\/gym-ckpt\/([^/\s]+)\/(\S+)$/m.exec(unit);
    expect(documentation).not.toBeNull();
    expect(existsSync(join(ROOT, documentation![1]!, documentation![2]!))).toBe(true);
    expect(fromUnit, "the unit's Documentation= is installed").toContain(documentation![1]);
    expect(fromDocs, "the unit's Documentation= is installed").toContain(documentation![1]);
  });

  it("the systemd install makes the state directory the unit's own before the checkpoint filesystem is mounted in it", () => {
    // systemd chowns an existing StateDirectory= whose owner is not the unit's User= recursively at
    // start, across mount points (and drops ACLs): a root-owned /var/lib/gym-ckpt, as `mkdir -p` for
    // the mount point leaves it, would have each host's first start chown the whole shared checkpoint
    // root, every participant's files included, or fail (238/STATE_DIRECTORY) on a root-squashed share.
    const unit = readFileSync(join(DEPLOY, "systemd/gym-ckpt-coordinator.service"), "utf8");
    const stateDir = `/var/lib/${/^StateDirectory=(\S+)$/m.exec(unit)![1]}`;
    const user = /^User=(\S+)$/m.exec(unit)![1]!;
    const group = /^Group=(\S+)$/m.exec(unit)![1]!;
    const checkpointRoot = /^RequiresMountsFor=(\S+)$/m.exec(unit)![1]!;
    expect(checkpointRoot.startsWith(`${stateDir}/`)).toBe(true);
    const operations = readFileSync(join(ROOT, "docs/operations.md"), "utf8");
    const create = new RegExp(`install -d -o ${user} -g ${group}(?: -m 0?755)? ${stateDir.replace(/[./]/g, "\\$&")}(?![\\w/])`);
    for (const [where, text, mount] of [
      ["the unit's install", unit, "mount the shared checkpoint filesystem"],
      ["docs/operations.md", operations, "After mounting the shared checkpoint filesystem"],
    ] as const) {
      const created = create.exec(text);
      expect(created, `${where} creates ${stateDir} owned by ${user}:${group}`).not.toBeNull();
      expect(text.indexOf(mount), `${where} mounts the share`).toBeGreaterThan(-1);
      expect(created!.index, `${where}: before the share is mounted`).toBeLessThan(text.indexOf(mount));
    }
  });

  it("the systemd unit leaves the checkpoint directories it creates writable by its group, as docs/operations.md tells participants on the host", () => {
    const unit = readFileSync(join(DEPLOY, "systemd/gym-ckpt-coordinator.service"), "utf8");
    expect(unit).toMatch(/^Group=gym-ckpt$/m);
    // systemd's default UMask is 0022: participants in the group could not create <root>/<id>/gym.
    const umask = Number.parseInt(/^UMask=([0-7]+)$/m.exec(unit)?.[1] ?? "0022", 8);
    expect(umask & 0o020).toBe(0);
    const operations = readFileSync(join(DEPLOY, "../docs/operations.md"), "utf8");
    expect(operations).toContain("chmod 2770 /var/lib/gym-ckpt/checkpoints");
    expect(operations).toMatch(/SupplementaryGroups=gym-ckpt.*UMask=0002/s);
  });
});

/** The flags a command line passes (`--name`, or `--name=value`), `--no-x` included. */
function flagsOf(args: readonly string[]): string[] {
  return args.filter((arg) => arg.startsWith("--")).map((arg) => arg.split("=")[0]!);
}

/** The `gym-ckpt <command>` options, as commander knows them. */
async function cliFlags(command: string): Promise<string[]> {
  const found = (await buildProgram()).commands.find((c) => c.name() === command);
  expect(found, `gym-ckpt ${command}`).toBeDefined();
  return found!.options.map((o) => o.long!).concat("--help");
}

/**
 * The flags and GYM_CKPT_* variables a participant program's `--help` lists, from the build `npm test`
 * makes first (a tsx run per program compiles it all again: seconds of CPU that starve
 * timing-sensitive tests beside).
 */
async function programHelp(distPath: string): Promise<{ flags: string[]; variables: string[] }> {
  const source = join(ROOT, distPath.replace(/^dist\//, "").replace(/\.js$/, ".ts"));
  expect(existsSync(source), `${distPath} is built from ${relative(ROOT, source)}`).toBe(true);
  const { stdout } = await promisify(execFile)(process.execPath, [join(ROOT, distPath), "--help"], { cwd: ROOT, timeout: 30_000 });
  const found = (pattern: RegExp) => [...new Set([...stdout.matchAll(pattern)].map((m) => m[0]))];
  return { flags: found(/--[a-z][a-z0-9-]*/g).concat("--help"), variables: found(/\bGYM_CKPT_[A-Z0-9_]+/g) };
}

/**
 * The GYM_CKPT_* variables the coordinator daemon reads: its config's (CONFIG_ENV), the config
 * file's, and the bucket replicas every process reads (protocol/nats-connection.ts).
 */
const COORDINATOR_VARIABLES = [...CONFIG_ENV.map((e) => e.env), "GYM_CKPT_CONFIG", "GYM_CKPT_NATS_REPLICAS"];

/** The variables an environment sets that look like gym-ckpt's own. */
function gymCkptVariables(names: readonly string[]): string[] {
  return names.filter((name) => name.startsWith("GYM_CKPT_"));
}

/** A command line's value after `flag`. */
function valueOf(args: readonly string[], flag: string): string | undefined {
  const at = args.indexOf(flag);
  return at < 0 ? undefined : args[at + 1];
}

describe("the commands deploy/ runs", () => {
  it("every coordinator command line (compose, Kubernetes, systemd) and the compose usage's CLI call pass only flags gym-ckpt takes", async () => {
    const compose = yamlFile(join(DEPLOY, "docker-compose.yml"));
    const container = yamlFile(join(DEPLOY, "kubernetes/base/deployment.yaml")).spec.template.spec.containers[0];
    const unit = readFileSync(join(DEPLOY, "systemd/gym-ckpt-coordinator.service"), "utf8");
    const execStart = /^ExecStart=(.*)$/m.exec(unit)![1]!.split(/\s+/);
    const lines: [string, string[]][] = [
      ["compose coordinator-a", compose.services["coordinator-a"].command],
      ["compose coordinator-b", compose.services["coordinator-b"].command],
      ["kubernetes", container.args],
      ["systemd", execStart.slice(execStart.findIndex((arg) => arg.endsWith("dist/coordinator/cli/main.js")))],
    ];
    const coordinator = await cliFlags("coordinator");
    for (const [where, args] of lines) {
      expect(args[0], where).toMatch(/(^|\/)dist\/coordinator\/cli\/main\.js$/);
      expect(args[1], where).toBe("coordinator");
      for (const flag of flagsOf(args.slice(2))) expect(coordinator, `${where}: ${flag}`).toContain(flag);
    }
    // The usage comment's (and docs/operations.md's) `exec coordinator-a node dist/coordinator/cli/main.js checkpoint …`.
    const usage = /exec coordinator-a \\\n#\s+node (dist\/coordinator\/cli\/main\.js .*)$/m.exec(readFileSync(join(DEPLOY, "docker-compose.yml"), "utf8"));
    expect(usage).not.toBeNull();
    const [, command, ...rest] = usage![1]!.split(/\s+/);
    const flags = await cliFlags(command!);
    for (const flag of flagsOf(rest)) expect(flags, `checkpoint ${flag}`).toContain(flag);
  });

  it("every Gym container runs a program that takes its flags, its URLs name the ports the others listen on, and Prometheus scrapes their metrics ports", { timeout: 120_000 }, async () => {
    const compose = yamlFile(join(DEPLOY, "docker-compose.yml"));
    const gym = Object.entries<Yaml>(compose.services).filter(([name]) => name.startsWith("gym-"));
    expect(gym.map(([name]) => name).sort()).toEqual(["gym-agent", "gym-environment", "gym-model", "gym-policy", "gym-resources"]);
    const helps = await Promise.all(gym.map(([, service]) => programHelp(service.command[0])));
    const ports = new Set<string>();
    gym.forEach(([name, service], i) => {
      const args: string[] = service.command.slice(1);
      for (const flag of flagsOf(args)) expect(helps[i]!.flags, `${name}: ${flag}`).toContain(flag);
      // A variable the program does not read (renamed in the code) is ignored without a word.
      for (const variable of gymCkptVariables(Object.keys(service.environment ?? {}))) expect(helps[i]!.variables, `${name}: ${variable}`).toContain(variable);
      ports.add(valueOf(args, "--port")!);
    });
    // One network namespace: each URL a server calls is another's loopback --port.
    for (const [name, service] of gym) {
      for (const flag of ["--upstream", "--policy-url", "--resources-url", "--agent-url"]) {
        const url = valueOf(service.command, flag);
        if (url !== undefined) expect([...ports], `${name} ${flag} ${url}`).toContain(new URL(url).port);
      }
    }
    // Prometheus: the coordinators' and every Gym server's --metrics-port, nothing else.
    const prometheus = yamlFile(join(DEPLOY, "prometheus/prometheus.yml"));
    const targets = prometheus.scrape_configs.flatMap((job: Yaml) => job.static_configs.flatMap((c: Yaml) => c.targets as string[])).sort();
    const metrics = Object.entries<Yaml>(compose.services)
      .filter(([, service]) => Array.isArray(service.command) && valueOf(service.command, "--metrics-port") !== undefined)
      .map(([name, service]) => `${service.network_mode?.replace(/^service:/, "") ?? name}:${valueOf(service.command, "--metrics-port")}`)
      .sort();
    expect(targets).toEqual(metrics);
    // Scraped from the Prometheus container: each metrics endpoint binds every interface, not its 127.0.0.1 default.
    for (const [name, service] of Object.entries<Yaml>(compose.services)) {
      if (Array.isArray(service.command) && valueOf(service.command, "--metrics-port") !== undefined) {
        expect(service.environment?.OTEL_EXPORTER_PROMETHEUS_HOST, `${name}: OTEL_EXPORTER_PROMETHEUS_HOST`).toBe("0.0.0.0");
      }
    }
  });

  it("Kubernetes: Prometheus's pod annotations and the metrics port name the port the coordinator serves /metrics on, on every interface", () => {
    const template = yamlFile(join(DEPLOY, "kubernetes/base/deployment.yaml")).spec.template;
    const container = template.spec.containers[0];
    const port = valueOf(container.args, "--metrics-port");
    expect(port).toBeDefined();
    expect(template.metadata.annotations["prometheus.io/scrape"]).toBe("true");
    expect(template.metadata.annotations["prometheus.io/port"]).toBe(port);
    expect(template.metadata.annotations["prometheus.io/path"]).toBe("/metrics");
    expect(String(container.ports.find((p: Yaml) => p.name === "metrics").containerPort)).toBe(port);
    const env = Object.fromEntries(container.env.map((e: Yaml) => [e.name, e.value]));
    expect(env.OTEL_EXPORTER_PROMETHEUS_HOST).toBe("0.0.0.0");
    const service = yamlFile(join(DEPLOY, "kubernetes/base/service.yaml"));
    expect(service.spec.ports.find((p: Yaml) => p.name === "metrics").targetPort).toBe("metrics");
  });

  it("every GYM_CKPT_ variable a coordinator gets (compose, Kubernetes and its Secret, systemd and its environment file) is one it reads", () => {
    const compose = yamlFile(join(DEPLOY, "docker-compose.yml"));
    const kustomization = readFileSync(join(DEPLOY, "kubernetes/base/kustomization.yaml"), "utf8");
    const container = yamlFile(join(DEPLOY, "kubernetes/base/deployment.yaml")).spec.template.spec.containers[0];
    const unit = readFileSync(join(DEPLOY, "systemd/gym-ckpt-coordinator.service"), "utf8");
    const environmentFile = /^EnvironmentFile=(\S+)$/m.exec(unit)![1]!;
    const fileVariables = new RegExp(`${environmentFile.replace(/[./]/g, "\\$&")} \\(([^;]*);`).exec(unit)![1]!;
    const sets: [string, string[]][] = [
      ...Object.entries<Yaml>(compose.services)
        .filter(([name]) => name.startsWith("coordinator-"))
        .map(([name, service]): [string, string[]] => [`compose ${name}`, Object.keys(service.environment)]),
      ["kubernetes env", container.env.map((e: Yaml) => e.name)],
      ["kubernetes Secret", [...kustomization.matchAll(/--from-literal=(\w+)=/g)].map((m) => m[1]!)],
      ["systemd Environment=", [...unit.matchAll(/^#?\s*Environment=(\w+)=/gm)].map((m) => m[1]!)],
      [`systemd ${environmentFile}`, [...fileVariables.matchAll(/(\w+)=\.\.\./g)].map((m) => m[1]!)],
    ];
    for (const [where, names] of sets) {
      expect(names.length, where).toBeGreaterThan(0);
      for (const variable of gymCkptVariables(names)) expect(COORDINATOR_VARIABLES, `${where}: ${variable}`).toContain(variable);
    }
  });
});

/**
 * What `gym-ckpt coordinator <args> --print-config` makes of a command line and an environment: the
 * CLI's own flags, the config loader and its schema, run from the build in an environment holding only
 * `env` (none of this machine's GYM_CKPT_* or OTEL_*).
 */
async function effectiveConfig(where: string, args: readonly string[], env: Record<string, string>): Promise<Yaml> {
  const run = await promisify(execFile)(process.execPath, [join(ROOT, "dist/coordinator/cli/main.js"), ...args, "--print-config"], {
    cwd: ROOT,
    timeout: 30_000,
    env: { PATH: process.env.PATH ?? "", TMPDIR: process.env.TMPDIR ?? tmpdir(), ...env },
  }).catch((error: { stderr?: string; message: string }) => {
    throw new Error(`${where}: gym-ckpt coordinator refuses its configuration: ${error.stderr || error.message}`);
  });
  return JSON.parse(run.stdout);
}

/** A compose value with its `${VAR}`, `${VAR:?message}` or `${VAR:-default}` replaced from `values` (each must be given). */
function interpolate(value: string, values: Record<string, string>): string {
  return value.replace(/\$\{(\w+)(?::?[-?][^}]*)?\}/g, (_all, name: string) => {
    expect(values, `compose interpolates \${${name}}`).toHaveProperty(name);
    return values[name]!;
  });
}

/** A Go duration as compose's `stop_grace_period` takes it (`30s`, `1m30s`, `1.5s`), in ms. */
function composeDurationMs(value: string): number {
  const units: Record<string, number> = { h: 3_600_000, m: 60_000, s: 1_000, ms: 1, us: 0.001, ns: 0.000_001 };
  const parts = [...value.matchAll(/(\d+(?:\.\d+)?)(h|ms|m|s|us|ns)/g)];
  expect(parts.map((m) => m[0]).join(""), `compose duration ${value}`).toBe(value);
  return parts.reduce((sum, m) => sum + Number(m[1]) * units[m[2]!]!, 0);
}

/** A systemd time span as `TimeoutStopSec=` takes it (`30`, `30s`, `1min 30s`), in ms. */
function systemdSpanMs(value: string): number {
  if (/^\d+$/.test(value)) return Number(value) * 1_000;
  const units: Record<string, number> = { ms: 1, s: 1_000, sec: 1_000, m: 60_000, min: 60_000, h: 3_600_000 };
  const parts = [...value.matchAll(/(\d+)\s*(ms|sec|s|min|m|h)\b/g)];
  expect(parts.length, `systemd time span ${value}`).toBeGreaterThan(0);
  return parts.reduce((sum, m) => sum + Number(m[1]) * units[m[2]!]!, 0);
}

/**
 * What a stopping coordinator may take past `stop_grace_ms` (its ops answered or given up): the
 * lease's release waits for a renewal in flight (bounded by the lease), then its delete, the NATS
 * drain and the telemetry flush (at most 2 s). A supervisor that kills it sooner leaves the lease
 * held (the successor waits it out) and the last spans unsent.
 */
function stopNeedsMs(config: Yaml): number {
  return config.stop_grace_ms + config.lease_ms + 5_000;
}

describe("the configuration of every coordinator deploy/ starts", () => {
  // What an operator provides outside the repository: tokens and NATS credentials.
  const SECRETS = { GYM_CKPT_TOKEN: "participants-token", GYM_CKPT_CONTROLLER_TOKEN: "controller-token", GYM_CKPT_NATS_USER: "coordinator", GYM_CKPT_NATS_PASS: "nats-password" };

  it("compose: each coordinator's environment and flags load, with the checkpoint volume as root and the HTTP API on the published port", { timeout: 60_000 }, async () => {
    const compose = yamlFile(join(DEPLOY, "docker-compose.yml"));
    const names = Object.keys(compose.services).filter((name) => name.startsWith("coordinator-"));
    expect(names.sort()).toEqual(["coordinator-a", "coordinator-b"]);
    const configs = await Promise.all(
      names.map((name) => {
        const service = compose.services[name];
        const env = Object.fromEntries(Object.entries<string>(service.environment).map(([key, value]) => [key, interpolate(String(value), SECRETS)]));
        return effectiveConfig(`compose ${name}`, service.command.slice(1), env);
      }),
    );
    names.forEach((name, i) => {
      const service = compose.services[name];
      const config = configs[i];
      expect(service.volumes.map((v: string) => v.split(":")[1]), name).toContain(config.checkpoint_root);
      // Published from the container (and probed by its healthcheck): every interface, the port compose maps.
      expect(config.http, name).toMatchObject({ enabled: true, host: "0.0.0.0" });
      expect(service.ports.map((p: string) => p.split(":").at(-1)), name).toContain(String(config.http.port));
      expect(service.healthcheck.test.join(" "), name).toContain(`:${config.http.port}/healthz`);
      expect(compose.services).toHaveProperty(new URL(config.nats.servers).hostname);
      expect(config.controller_token, name).toBe("[Redacted]");
    });
    // The Gym containers join them: the same NATS, deployment and participants' token, and the
    // checkpoint root on the same volume at the same path (participants write records where the
    // coordinator writes checkpoint.json).
    const volumeAt = (service: Yaml, path: string) => (service.volumes as string[]).map((v) => v.split(":")).find(([, target]) => target === path)?.[0];
    const coordinatorEnv = compose.services[names[0]!].environment;
    const checkpoints = volumeAt(compose.services[names[0]!], configs[0].checkpoint_root);
    expect(checkpoints).toBeDefined();
    for (const [name, service] of Object.entries<Yaml>(compose.services).filter(([name]) => name.startsWith("gym-"))) {
      const env = service.environment ?? {};
      const args: string[] = service.command;
      expect(valueOf(args, "--nats") ?? env.GYM_CKPT_NATS_URL, `${name}: NATS`).toBe(configs[0].nats.servers);
      expect(valueOf(args, "--deployment") ?? env.GYM_CKPT_DEPLOYMENT, `${name}: deployment`).toBe(configs[0].deployment);
      expect(env.GYM_CKPT_TOKEN, `${name}: token`).toBe(coordinatorEnv.GYM_CKPT_TOKEN);
      const root = valueOf(args, "--checkpoint-root") ?? env.GYM_CKPT_CHECKPOINT_ROOT;
      expect(root, `${name}: checkpoint root`).toBe(configs[0].checkpoint_root);
      expect(volumeAt(service, root), `${name}: the checkpoint volume at ${root}`).toBe(checkpoints);
    }
    // Docker's default stop_grace_period is 10 s: below the coordinator's own stop_grace_ms.
    names.forEach((name, i) => {
      const grace = composeDurationMs(compose.services[name].stop_grace_period ?? "10s");
      expect(grace, `${name}: stop_grace_period`).toBeGreaterThanOrEqual(stopNeedsMs(configs[i]));
    });
    // One deployment, two coordinators.
    expect(configs[0].deployment).toBe(configs[1].deployment);
    expect(configs[0].coordinator_id).not.toBe(configs[1].coordinator_id);
  });

  it("Kubernetes: the config map, the Secret's variables and the container's env and args load, with the mounted volume as root and the probed port", { timeout: 60_000 }, async () => {
    const base = join(DEPLOY, "kubernetes/base");
    const kustomization = yamlFile(join(base, "kustomization.yaml"));
    const pod = yamlFile(join(base, "deployment.yaml")).spec.template.spec;
    const container = pod.containers[0];
    // --config names a file of the config map the pod mounts: the kustomization's generated one.
    const configPath: string = valueOf(container.args, "--config")!;
    const mount = container.volumeMounts.find((m: Yaml) => configPath.startsWith(`${m.mountPath}/`));
    const configMap = pod.volumes.find((v: Yaml) => v.name === mount.name).configMap.name;
    const generated: string[] = kustomization.configMapGenerator.find((g: Yaml) => g.name === configMap).files;
    expect(generated).toContain(configPath.slice(mount.mountPath.length + 1));
    const args = container.args.slice(1).map((arg: string) => (arg === configPath ? join(base, configPath.slice(mount.mountPath.length + 1)) : arg));
    // The Secret the kustomization's comment creates, and the container's env (a field reference: the pod name).
    const secret = Object.fromEntries([...readFileSync(join(base, "kustomization.yaml"), "utf8").matchAll(/--from-literal=(\w+)=/g)].map((m) => [m[1]!, SECRETS[m[1] as keyof typeof SECRETS] ?? "x"]));
    expect(Object.keys(secret).sort()).toEqual(Object.keys(SECRETS).sort());
    const env = Object.fromEntries(container.env.map((e: Yaml) => [e.name, e.value ?? "gym-ckpt-coordinator-0"]));
    const config = await effectiveConfig("kubernetes", args, { ...secret, ...env });
    const checkpoints = pod.volumes.find((v: Yaml) => v.persistentVolumeClaim).name;
    expect(container.volumeMounts.find((m: Yaml) => m.name === checkpoints).mountPath).toBe(config.checkpoint_root);
    expect(config.http).toMatchObject({ enabled: true, host: "0.0.0.0" });
    expect(container.ports.find((p: Yaml) => p.name === container.readinessProbe.httpGet.port).containerPort).toBe(config.http.port);
    expect(config.coordinator_id).toBe("gym-ckpt-coordinator-0");
    expect(config.nats).toMatchObject({ user: "coordinator", pass: "[Redacted]" });
    // Kubernetes' default grace is 30 s.
    expect((pod.terminationGracePeriodSeconds ?? 30) * 1_000, "terminationGracePeriodSeconds").toBeGreaterThanOrEqual(stopNeedsMs(config));
  });

  it("systemd: the config file and environment file the unit's install describes, with its flags, load, with the mount it requires as root", { timeout: 60_000 }, async () => {
    const unit = readFileSync(join(DEPLOY, "systemd/gym-ckpt-coordinator.service"), "utf8");
    const execStart = /^ExecStart=(.*)$/m.exec(unit)![1]!.split(/\s+/);
    const args = execStart.slice(execStart.findIndex((arg) => arg.endsWith("dist/coordinator/cli/main.js")) + 1);
    // `the config to <file> with "key": value, …` and `… to <env file> (NAME=..., …)`.
    const described = /the config to (\S+) with ((?:"\w+": "[^"]*"(?:, )?)+)/.exec(unit);
    expect(described, "the unit's install describes the config file").not.toBeNull();
    expect(valueOf(args, "--config")).toBe(described![1]);
    const environmentFile = /^EnvironmentFile=(\S+)$/m.exec(unit)![1]!;
    const fileVariables = new RegExp(`${environmentFile.replace(/[./]/g, "\\$&")} \\(([^;]*);`).exec(unit);
    expect(fileVariables, "the unit's install lists the environment file's variables").not.toBeNull();
    const env = Object.fromEntries([
      ...[...fileVariables![1]!.matchAll(/(\w+)=\.\.\./g)].map((m) => [m[1]!, SECRETS[m[1] as keyof typeof SECRETS] ?? "x"]),
      ...[...unit.matchAll(/^Environment=(\w+)=(.*)$/gm)].map((m) => [m[1]!, m[2]!]),
    ]);
    expect(Object.keys(env)).toEqual(expect.arrayContaining(Object.keys(SECRETS)));
    const dir = mkdtempSync(join(tmpdir(), "gym-ckpt-systemd-config-"));
    try {
      const file = join(dir, "config.json");
      writeFileSync(file, `{${described![2]}}`);
      const config = await effectiveConfig("systemd", args.map((arg) => (arg === described![1] ? file : arg)), env);
      expect(config.checkpoint_root).toBe(/^RequiresMountsFor=(\S+)$/m.exec(unit)![1]);
      expect(config.nats).toMatchObject({ user: "coordinator", pass: "[Redacted]" });
      // SIGTERM, then SIGKILL once TimeoutStopSec= (or TimeoutSec=; systemd's default 90 s) passed.
      expect(unit).toMatch(/^KillSignal=SIGTERM$/m);
      const timeout = /^TimeoutStopSec=(.+)$/m.exec(unit)?.[1] ?? /^TimeoutSec=(.+)$/m.exec(unit)?.[1] ?? "90s";
      expect(systemdSpanMs(timeout.trim()), "TimeoutStopSec").toBeGreaterThanOrEqual(stopNeedsMs(config));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
