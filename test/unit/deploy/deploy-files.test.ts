import { execFile } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { parseDocument } from "yaml";
import { buildProgram } from "../../../coordinator/cli/program.js";
import { loadConfig } from "../../../coordinator/config/config-loader.js";

/**
 * deploy/ never runs in the suite (no Docker daemon or cluster): its YAML must parse, the
 * Kubernetes config must pass the coordinator's schema, and the rules docs/operations.md states hold.
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

  it("the Kubernetes config passes the coordinator's schema with the Secret's variables, and its checkpoint root is the mounted volume", () => {
    const base = join(DEPLOY, "kubernetes/base");
    const config = loadConfig({
      file: join(base, "config.json"),
      env: { GYM_CKPT_TOKEN: "t", GYM_CKPT_CONTROLLER_TOKEN: "c", GYM_CKPT_NATS_USER: "coordinator", GYM_CKPT_NATS_PASS: "p", GYM_CKPT_COORDINATOR_ID: "pod-0" },
    });
    expect(config.http.host).toBe("0.0.0.0");
    const kustomization = yamlFile(join(base, "kustomization.yaml"));
    for (const resource of kustomization.resources) expect(files(base)).toContain(join(base, resource));
    const container = yamlFile(join(base, "deployment.yaml")).spec.template.spec.containers[0];
    expect(container.volumeMounts.map((m: Yaml) => m.mountPath)).toContain(config.checkpoint_root);
  });

  it("a coordinator rollout cannot wait for a standby to become ready", () => {
    const spec = yamlFile(join(DEPLOY, "kubernetes/base/deployment.yaml")).spec;
    expect(spec.template.spec.containers[0].readinessProbe.httpGet.path).toBe("/readyz");
    // Readiness = leadership: a new pod stands by while the old leader lives, so the old pods
    // must all go without waiting for a new one to become Ready.
    if (spec.strategy.type !== "Recreate") expect(spec.strategy.rollingUpdate.maxUnavailable).toBe("100%");
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

  it("the systemd unit leaves the checkpoint directories it creates writable by its group, as docs/operations.md tells participants on the host", () => {
    const unit = readFileSync(join(DEPLOY, "systemd/gym-ckpt-coordinator.service"), "utf8");
    expect(unit).toMatch(/^Group=gym-ckpt$/m);
    // systemd's default UMask is 0022: participants in the group could not create <root>/<id>/gym.
    const umask = Number.parseInt(/^UMask=([0-7]+)$/m.exec(unit)?.[1] ?? "0022", 8);
    expect(umask & 0o020).toBe(0);
    const operations = readFileSync(join(DEPLOY, "../docs/operations.md"), "utf8");
    expect(operations).toContain("chmod 2775 /var/lib/gym-ckpt/checkpoints");
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

/** The flags a participant program's `--help` lists (its source run through tsx, as no build is needed here). */
async function programFlags(distPath: string): Promise<string[]> {
  const source = join(ROOT, distPath.replace(/^dist\//, "").replace(/\.js$/, ".ts"));
  expect(existsSync(source), `${distPath} is built from ${relative(ROOT, source)}`).toBe(true);
  const { stdout } = await promisify(execFile)(process.execPath, ["--import", "tsx", source, "--help"], { cwd: ROOT, timeout: 30_000 });
  return [...new Set([...stdout.matchAll(/--[a-z][a-z0-9-]*/g)].map((m) => m[0]))].concat("--help");
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
    const helps = await Promise.all(gym.map(([, service]) => programFlags(service.command[0])));
    const ports = new Set<string>();
    gym.forEach(([name, service], i) => {
      const args: string[] = service.command.slice(1);
      for (const flag of flagsOf(args)) expect(helps[i], `${name}: ${flag}`).toContain(flag);
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
  });
});
