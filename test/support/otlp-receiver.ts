import { createServer, type IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";

/** One span as the OTLP/HTTP JSON exporter sends it, flattened with its resource's service.name. */
export interface ReceivedSpan {
  service: string;
  instanceId: string | undefined;
  traceId: string;
  spanId: string;
  parentSpanId: string | undefined;
  name: string;
  kind: number;
  attributes: Record<string, string | number | boolean>;
}

export interface OtlpReceiver {
  /** Base URL for OTEL_EXPORTER_OTLP_ENDPOINT (the exporters append /v1/traces, /v1/metrics). */
  url: string;
  spans(): ReceivedSpan[];
  /** Names of the metrics received over /v1/metrics. */
  metricNames(): Set<string>;
  /** Bodies that were not OTLP JSON (e.g. protobuf from a misconfigured exporter). */
  rejected(): number;
  close(): Promise<void>;
}

interface AnyValue {
  stringValue?: string;
  intValue?: string | number;
  doubleValue?: number;
  boolValue?: boolean;
}
interface KeyValue {
  key: string;
  value: AnyValue;
}

function valueOf(v: AnyValue): string | number | boolean {
  if (v.stringValue !== undefined) return v.stringValue;
  if (v.intValue !== undefined) return Number(v.intValue);
  if (v.doubleValue !== undefined) return v.doubleValue;
  if (v.boolValue !== undefined) return v.boolValue;
  return "";
}

function attributesOf(list: KeyValue[] | undefined): Record<string, string | number | boolean> {
  return Object.fromEntries((list ?? []).map((kv) => [kv.key, valueOf(kv.value)]));
}

async function bodyOf(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8");
}

/** A minimal OTLP/HTTP JSON receiver on 127.0.0.1 (no backend exists on Debian): collects spans and metric names. */
export async function startOtlpReceiver(): Promise<OtlpReceiver> {
  const spans: ReceivedSpan[] = [];
  const metricNames = new Set<string>();
  let rejected = 0;
  const server = createServer((req, res) => {
    void (async () => {
      const text = await bodyOf(req);
      if (req.method !== "POST" || !(req.headers["content-type"] ?? "").includes("json")) {
        rejected += 1;
        res.writeHead(415).end();
        return;
      }
      const body = JSON.parse(text) as {
        resourceSpans?: { resource?: { attributes?: KeyValue[] }; scopeSpans?: { spans?: any[] }[] }[];
        resourceMetrics?: { scopeMetrics?: { metrics?: { name: string }[] }[] }[];
      };
      if (req.url === "/v1/traces") {
        for (const rs of body.resourceSpans ?? []) {
          const resource = attributesOf(rs.resource?.attributes);
          for (const ss of rs.scopeSpans ?? []) {
            for (const s of ss.spans ?? []) {
              spans.push({
                service: String(resource["service.name"] ?? ""),
                instanceId: resource["service.instance.id"] === undefined ? undefined : String(resource["service.instance.id"]),
                traceId: s.traceId,
                spanId: s.spanId,
                parentSpanId: s.parentSpanId || undefined,
                name: s.name,
                kind: s.kind,
                attributes: attributesOf(s.attributes),
              });
            }
          }
        }
      } else if (req.url === "/v1/metrics") {
        for (const rm of body.resourceMetrics ?? []) for (const sm of rm.scopeMetrics ?? []) for (const m of sm.metrics ?? []) metricNames.add(m.name);
      }
      res.writeHead(200, { "content-type": "application/json" }).end("{}");
    })().catch(() => {
      rejected += 1;
      if (!res.headersSent) res.writeHead(400).end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    spans: () => [...spans],
    metricNames: () => new Set(metricNames),
    rejected: () => rejected,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
