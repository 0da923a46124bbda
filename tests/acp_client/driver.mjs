// An ACP client built on the official TypeScript SDK (@agentclientprotocol/sdk),
// driving an agent subprocess through a JSON plan of steps. It records every
// JSON-RPC line in both directions (the child's stdio is tapped below the
// SDK), validates each message against the SDK's schema/v1/schema.json, and
// always writes its output, then kills the agent.
//
//   node tests/acp_client/driver.mjs PLAN.json OUT.json
//
// The SDK and the validator are found in $ACP_SDK_NODE_MODULES, by default
// <repo>/.ci/node/node_modules (installed by .ci/run). The plan format and the
// output format are described in tests/acp_sdk.py.

import { spawn } from "node:child_process";
import { EventEmitter } from "node:events";
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath, pathToFileURL } from "node:url";
import { isDeepStrictEqual } from "node:util";

const [planPath, outPath] = process.argv.slice(2);
if (!planPath || !outPath) {
  process.stderr.write("usage: node driver.mjs PLAN.json OUT.json\n");
  process.exit(2);
}

const here = path.dirname(fileURLToPath(import.meta.url));
const nodeModules = path.resolve(process.env.ACP_SDK_NODE_MODULES || path.join(here, "..", "..", ".ci", "node", "node_modules"));
// Resolve as a module sitting next to node_modules would (its parent dir).
const req = createRequire(path.join(path.dirname(nodeModules), "__acp_harness__.js"));

const T0 = performance.now();
const now = () => Math.round((performance.now() - T0) * 1000) / 1000; // ms since start

// ---------------------------------------------------------------------------
// Output, written exactly once whatever happens.

const out = {
  driver: "tests/acp_client/driver.mjs",
  startedAt: new Date().toISOString(),
  sdk: null, // {name, version, entry, schema}
  validator: null,
  argv: null,
  messages: [], // {i, t, dir: "out"|"in", via: "sdk"|"raw"|"agent", line, msg?, parseError?}
  steps: [],
  updates: [], // session/update params as the SDK's handler received them (after its zod parse)
  permissionRequests: [],
  fileOps: [],
  clientRequests: [], // other agent->client requests (answered method-not-found)
  clientNotifications: [], // other agent->client notifications
  violations: [],
  unmapped: [],
  oddities: [],
  schemaMap: null,
  sdkLog: [], // what the SDK printed with console.error / console.warn
  driverErrors: [],
  stderr: "",
  exit: null, // {code, signal, t, how}
  finishedAt: null,
  ok: false,
};

let finished = false;
let plan = null;
let child = null;
let stderrChunks = [];
let stderrBytes = 0;
const STDERR_CAP = 2 * 1024 * 1024;

function driverError(where, err) {
  out.driverErrors.push({ t: now(), where, error: String(err && err.stack ? err.stack : err) });
}

function writeOutput() {
  const tmp = outPath + ".tmp";
  fs.writeFileSync(tmp, JSON.stringify(out, null, 1));
  fs.renameSync(tmp, outPath);
}

// ---------------------------------------------------------------------------
// Load the SDK, its schema and the validator.

let acp;
let Ajv2020;
let addFormats;
let schema;
try {
  const entry = req.resolve("@agentclientprotocol/sdk");
  acp = await import(pathToFileURL(entry).href);
  const schemaPath = req.resolve("@agentclientprotocol/sdk/schema/v1/schema.json");
  schema = JSON.parse(fs.readFileSync(schemaPath, "utf8"));
  const pkg = JSON.parse(fs.readFileSync(path.join(nodeModules, "@agentclientprotocol", "sdk", "package.json"), "utf8"));
  out.sdk = { name: pkg.name, version: pkg.version, entry, schema: schemaPath, protocolVersion: acp.PROTOCOL_VERSION };
  const ajvMod = req("ajv/dist/2020");
  Ajv2020 = ajvMod.default || ajvMod;
  const fmtMod = req("ajv-formats");
  addFormats = fmtMod.default || fmtMod;
  const ajvPkg = JSON.parse(fs.readFileSync(path.join(nodeModules, "ajv", "package.json"), "utf8"));
  const fmtPkg = JSON.parse(fs.readFileSync(path.join(nodeModules, "ajv-formats", "package.json"), "utf8"));
  out.validator = { ajv: ajvPkg.version, "ajv-formats": fmtPkg.version };
} catch (err) {
  driverError("load", err);
  out.finishedAt = new Date().toISOString();
  writeOutput();
  process.exit(3);
}

// Route the SDK's diagnostics into the output (and still to our stderr).
for (const level of ["error", "warn"]) {
  const orig = console[level].bind(console);
  console[level] = (...args) => {
    out.sdkLog.push({ t: now(), level, text: args.map((a) => (typeof a === "string" ? a : safeJson(a))).join(" ") });
    orig(...args);
  };
}

function safeJson(v) {
  try {
    return JSON.stringify(v);
  } catch {
    return String(v);
  }
}

// ---------------------------------------------------------------------------
// Schema: the method -> definition map, read from the x-method / x-side
// annotations of schema.json's $defs.
//
//   *Request      params of a request; x-side = the side that receives it
//   *Notification params of a notification; x-side = the receiver ("protocol": either)
//   *Response     result of a request; x-side = the side that sends it (handles the request)
//
// "out" is client -> agent, "in" is agent -> client.

const SCHEMA_ID = "https://agentclientprotocol.com/schema/v1/schema.json";
schema.$id = SCHEMA_ID;
const defs = schema.$defs;

const map = { request: { in: {}, out: {} }, notification: { in: {}, out: {} }, response: { in: {}, out: {} } };
const schemaMapList = [];
for (const [name, def] of Object.entries(defs)) {
  const method = def["x-method"];
  const side = def["x-side"];
  if (!method) continue;
  let kind = null;
  if (name.endsWith("Request")) kind = "request";
  else if (name.endsWith("Notification")) kind = "notification";
  else if (name.endsWith("Response")) kind = "response";
  if (!kind) {
    out.oddities.push({ where: "schema", note: `definition ${name} has x-method ${method} but no Request/Response/Notification suffix` });
    continue;
  }
  let dirs;
  if (side === "protocol") dirs = ["in", "out"];
  else if (kind === "response") dirs = side === "agent" ? ["in"] : ["out"];
  else dirs = side === "agent" ? ["out"] : ["in"];
  for (const dir of dirs) {
    map[kind][dir][method] = name;
    schemaMapList.push({ method, kind: kind === "response" ? "result" : "params", message: kind, dir, definition: name });
  }
}
// Every method the SDK names must be mapped.
const missing = [];
const sdkMethods = { agent: acp.AGENT_METHODS || {}, client: acp.CLIENT_METHODS || {}, protocol: acp.PROTOCOL_METHODS || {} };
for (const [side, table] of Object.entries(sdkMethods)) {
  for (const method of Object.values(table)) {
    const dir = side === "agent" ? "out" : side === "client" ? "in" : "out";
    const asReq = map.request[dir][method];
    const asNote = map.notification[dir][method];
    const back = dir === "out" ? "in" : "out";
    if (!asReq && !asNote) missing.push({ method, side, what: "params definition" });
    if (asReq && !map.response[back][method]) missing.push({ method, side, what: "result definition" });
  }
}
out.schemaMap = { mapping: schemaMapList, missing };

const ajv = new Ajv2020({ strict: false, allErrors: true, discriminator: true, validateFormats: true });
addFormats(ajv);
const intIn = (lo, hi) => ({ type: "number", validate: (x) => Number.isInteger(x) && x >= lo && x <= hi });
ajv.addFormat("uint16", intIn(0, 65535));
ajv.addFormat("uint32", intIn(0, 4294967295));
ajv.addFormat("uint64", intIn(0, Number.MAX_SAFE_INTEGER));
ajv.addSchema(schema);

const validators = new Map();
function validatorFor(key, sch) {
  if (!validators.has(key)) {
    try {
      validators.set(key, ajv.compile(sch));
    } catch (err) {
      driverError(`compile ${key}`, err);
      validators.set(key, null);
    }
  }
  return validators.get(key);
}
const JSONRPC = { type: "object", required: ["jsonrpc"], properties: { jsonrpc: { const: "2.0" } } };
const ENVELOPE = {
  in: { request: "AgentRequest", response: "AgentResponse", notification: "AgentNotification" },
  out: { request: "ClientRequest", response: "ClientResponse", notification: "ClientNotification" },
};
function envelopeValidator(dir, kind, method) {
  if (kind === "notification" && typeof method === "string" && method.startsWith("$/")) {
    return ["#/anyOf/2 (ProtocolLevel)", validatorFor("env:protocol", { $ref: `${SCHEMA_ID}#/anyOf/2` })];
  }
  const name = ENVELOPE[dir][kind];
  return [`#/$defs/${name}`, validatorFor(`env:${name}`, { allOf: [JSONRPC, { $ref: `${SCHEMA_ID}#/$defs/${name}` }] })];
}
function defValidator(name) {
  return validatorFor(`def:${name}`, { $ref: `${SCHEMA_ID}#/$defs/${name}` });
}

function summarize(errors) {
  const list = (errors || []).map((e) => ({
    instancePath: e.instancePath,
    schemaPath: e.schemaPath,
    keyword: e.keyword,
    message: e.message,
    params: e.params,
  }));
  // The most specific error: the deepest instance path (the first of those).
  let best = list[0];
  for (const e of list) if (e.instancePath.split("/").length > best.instancePath.split("/").length) best = e;
  return { best, list: list.slice(0, 30), total: list.length };
}

// Validate every recorded message, in order, pairing responses with requests.
function validateAll() {
  const pending = { in: new Map(), out: new Map() }; // requests sent in dir, by JSON id
  const key = (id) => JSON.stringify(id);
  for (const m of out.messages) {
    const base = { msgIndex: m.i, dir: m.dir, via: m.via };
    const violation = (extra) => out.violations.push({ ...base, ...extra, message: truncate(m.line, 4000) });
    if (m.parseError) {
      violation({ kind: "invalid", source: "json", schemaPath: "(JSON)", error: `not JSON: ${m.parseError}` });
      continue;
    }
    const msg = m.msg;
    if (msg === null || typeof msg !== "object" || Array.isArray(msg)) {
      violation({
        kind: "invalid",
        source: "jsonrpc",
        schemaPath: "(JSON-RPC 2.0 message object)",
        error: Array.isArray(msg) ? "a JSON array (ACP does not use JSON-RPC batches)" : `not a JSON object: ${safeJson(msg)}`,
      });
      continue;
    }
    const hasMethod = "method" in msg;
    const hasId = "id" in msg;
    const kind = hasMethod ? (hasId ? "request" : "notification") : hasId || "result" in msg || "error" in msg ? "response" : "invalid";
    const method = hasMethod ? msg.method : undefined;
    const id = msg.id;
    Object.assign(base, { kind, method, id });
    if (kind === "invalid") {
      violation({ source: "jsonrpc", schemaPath: "(JSON-RPC 2.0)", error: "neither a request, a notification nor a response" });
      continue;
    }
    // JSON-RPC 2.0 rules the schema does not spell out.
    if (kind === "response") {
      if ("result" in msg && "error" in msg) violation({ source: "jsonrpc", schemaPath: "(JSON-RPC 2.0 response)", error: "both result and error" });
      if (!("result" in msg) && !("error" in msg)) violation({ source: "jsonrpc", schemaPath: "(JSON-RPC 2.0 response)", error: "neither result nor error" });
      if (!hasId) violation({ source: "jsonrpc", schemaPath: "(JSON-RPC 2.0 response)", error: "no id" });
    }
    const allowed = kind === "response" ? ["jsonrpc", "id", "result", "error"] : kind === "request" ? ["jsonrpc", "id", "method", "params"] : ["jsonrpc", "method", "params"];
    const extra = Object.keys(msg).filter((k) => !allowed.includes(k));
    if (extra.length) out.oddities.push({ ...base, note: `unexpected top-level member(s) ${extra.join(", ")}` });

    // The envelope.
    const [envPath, env] = envelopeValidator(m.dir, kind, method);
    if (env && !env(msg)) {
      const s = summarize(env.errors);
      violation({ source: "schema", definition: envPath, schemaPath: s.best.schemaPath, error: `${s.best.instancePath || "/"} ${s.best.message}`, errors: s.list, errorCount: s.total });
    }

    // The params / result against the method's definition.
    if (kind === "request" || kind === "notification") {
      if (kind === "request") pending[m.dir].set(key(id), method);
      const name = map[kind][m.dir][method];
      if (!name) {
        out.unmapped.push({ ...base, reason: typeof method === "string" && method.startsWith("_") ? "extension method" : `no ${kind} definition for this method in this direction` });
        continue;
      }
      const v = defValidator(name);
      const params = "params" in msg ? msg.params : undefined;
      if (v && !v(params)) {
        const s = summarize(v.errors);
        violation({ source: "schema", definition: `#/$defs/${name}`, target: "params", schemaPath: s.best.schemaPath, error: `params${s.best.instancePath} ${s.best.message}`, errors: s.list, errorCount: s.total });
      }
    } else {
      const back = m.dir === "in" ? "out" : "in";
      const reqMethod = pending[back].get(key(id));
      if (reqMethod === undefined) {
        out.unmapped.push({ ...base, reason: id === null ? "response with id null (answers no request)" : "response to no request sent with this id" });
        continue;
      }
      pending[back].delete(key(id));
      base.method = reqMethod;
      if ("error" in msg) continue; // the envelope checked the Error object
      const name = map.response[m.dir][reqMethod];
      if (!name) {
        out.unmapped.push({ ...base, reason: reqMethod.startsWith("_") ? "extension method" : "no result definition for this method in this direction" });
        continue;
      }
      const v = defValidator(name);
      if (v && !v(msg.result)) {
        const s = summarize(v.errors);
        violation({ source: "schema", definition: `#/$defs/${name}`, target: "result", schemaPath: s.best.schemaPath, error: `result${s.best.instancePath} ${s.best.message}`, errors: s.list, errorCount: s.total });
      }
    }
  }
}

function truncate(s, n) {
  return typeof s === "string" && s.length > n ? s.slice(0, n) + `... (${s.length} chars)` : s;
}

// ---------------------------------------------------------------------------
// The wire: every line, both directions, in order.

const bus = new EventEmitter();
bus.setMaxListeners(1000);

function record(dir, via, line) {
  const m = { i: out.messages.length, t: now(), dir, via, line };
  try {
    m.msg = JSON.parse(line);
  } catch (err) {
    m.parseError = String(err.message || err);
  }
  out.messages.push(m);
  if (dir === "out" && via === "sdk" && m.msg && typeof m.msg === "object" && "method" in m.msg && "id" in m.msg) claimRequestId(m);
  bus.emit(dir, m);
  return m;
}

function lineSplitter(onLine) {
  let buf = "";
  const decoder = new TextDecoder();
  return {
    push(chunk) {
      buf += decoder.decode(chunk, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
        if (line.trim()) onLine(line);
      }
    },
    flush() {
      buf += decoder.decode();
      if (buf.trim()) onLine(buf);
      buf = "";
    },
  };
}

// Which JSON-RPC id the SDK gave a request a step sent (FIFO per method).
const idClaims = new Map(); // method -> [resolve]
function expectRequestId(method) {
  let resolve;
  const p = new Promise((r) => (resolve = r));
  if (!idClaims.has(method)) idClaims.set(method, []);
  idClaims.get(method).push(resolve);
  return p;
}
function claimRequestId(m) {
  const q = idClaims.get(m.msg.method);
  if (q && q.length) q.shift()({ id: m.msg.id, index: m.i });
}

function responseIndexFor(id, from = 0) {
  for (let k = from; k < out.messages.length; k++) {
    const m = out.messages[k];
    if (m.dir === "in" && m.msg && typeof m.msg === "object" && !("method" in m.msg) && isDeepStrictEqual(m.msg.id, id)) return k;
  }
  return null;
}

// ---------------------------------------------------------------------------
// Client state: permission policy, cancels.

let permissionQueue = ["reject_once"]; // the last entry is sticky
const pendingPermissions = []; // {sessionId, resolve, rec}
const cancelledSessions = new Set(); // sessions whose current turn the client cancelled
let conn = null; // ClientConnection
let agentCtx = null; // ClientContext

function nextPolicy() {
  return permissionQueue.length > 1 ? permissionQueue.shift() : permissionQueue[0];
}

function choose(policy, options) {
  const p = typeof policy === "string" ? { kind: policy } : policy || {};
  if (p.optionId !== undefined) return options.find((o) => o.optionId === p.optionId) || null;
  if (p.kind) return options.find((o) => o.kind === p.kind) || null;
  return null;
}

function answerPendingPermissions(sessionId, why) {
  for (let k = pendingPermissions.length - 1; k >= 0; k--) {
    const p = pendingPermissions[k];
    if (sessionId === undefined || p.sessionId === sessionId) {
      pendingPermissions.splice(k, 1);
      p.rec.outcome = { outcome: "cancelled" };
      p.rec.answeredAt = now();
      p.rec.answeredBecause = why;
      p.resolve({ outcome: { outcome: "cancelled" } });
    }
  }
}

async function sendCancel(sessionId, via, abortController, reason) {
  const rec = { t: now(), sessionId, via, reason };
  cancelledSessions.add(sessionId);
  if (via !== "request") {
    try {
      await agentCtx.notify(acp.methods.agent.session.cancel, { sessionId });
    } catch (err) {
      rec.error = String(err && err.message ? err.message : err);
    }
  }
  if (via === "request" || via === "both") abortController?.abort(new Error("cancelled by the plan"));
  // The spec: after session/cancel the client answers every pending
  // session/request_permission of the session with the `cancelled` outcome.
  answerPendingPermissions(sessionId, "session/cancel");
  return rec;
}

// ---------------------------------------------------------------------------
// The client app.

function buildClient() {
  return acp
    .client({ name: "voice-acp-sdk-harness" })
    .onNotification(acp.methods.client.session.update, ({ params }) => {
      out.updates.push({ t: now(), sessionId: params.sessionId, update: params.update });
    })
    .onRequest(acp.methods.client.session.requestPermission, ({ params, signal, requestId }) => {
      const rec = { t: now(), requestId, sessionId: params.sessionId, toolCall: params.toolCall, options: params.options, policy: null, outcome: null, answeredAt: null };
      out.permissionRequests.push(rec);
      bus.emit("permission", rec);
      if (cancelledSessions.has(params.sessionId)) {
        rec.policy = "(turn cancelled)";
        rec.outcome = { outcome: "cancelled" };
        rec.answeredAt = now();
        rec.answeredBecause = "session/cancel (sent before this request reached the handler)";
        return { outcome: { outcome: "cancelled" } };
      }
      const policy = nextPolicy();
      rec.policy = policy;
      const mode = typeof policy === "string" ? policy : policy && policy.kind ? policy.kind : policy && policy.optionId !== undefined ? "optionId" : "wait";
      if (mode === "cancelled") {
        rec.outcome = { outcome: "cancelled" };
        rec.answeredAt = now();
        return rec.outcome;
      }
      if (mode === "error") {
        rec.answeredAt = now();
        rec.outcome = { error: "internal error (plan policy)" };
        throw acp.RequestError.internalError(undefined, "refused by the test plan");
      }
      if (mode !== "wait") {
        const opt = choose(policy, params.options || []);
        if (!opt) {
          // No option of that kind: answer cancelled, and say so.
          rec.matched = false;
          rec.outcome = { outcome: "cancelled" };
          rec.answeredAt = now();
          out.oddities.push({ where: "requestPermission", note: `policy ${safeJson(policy)} matches none of the options ${safeJson((params.options || []).map((o) => [o.optionId, o.kind]))}; answered cancelled` });
          return rec.outcome;
        }
        rec.matched = true;
        rec.outcome = { outcome: "selected", optionId: opt.optionId };
        rec.answeredAt = now();
        return { outcome: { outcome: "selected", optionId: opt.optionId } };
      }
      // "wait": held until the plan cancels the turn (or the agent cancels the request).
      return new Promise((resolve, reject) => {
        pendingPermissions.push({ sessionId: params.sessionId, resolve, rec });
        signal.addEventListener(
          "abort",
          () => {
            const k = pendingPermissions.findIndex((p) => p.rec === rec);
            if (k < 0) return;
            pendingPermissions.splice(k, 1);
            if (conn && conn.signal.aborted) {
              rec.answeredBecause = "connection closed";
              reject(signal.reason);
              return;
            }
            rec.outcome = { outcome: "cancelled" };
            rec.answeredAt = now();
            rec.answeredBecause = "$/cancel_request from the agent";
            resolve({ outcome: { outcome: "cancelled" } });
          },
          { once: true },
        );
      });
    })
    .onRequest(acp.methods.client.fs.readTextFile, async ({ params }) => {
      const rec = { t: now(), method: "fs/read_text_file", params };
      out.fileOps.push(rec);
      if (plan.readDelayMs) await new Promise((resolve) => setTimeout(resolve, plan.readDelayMs)); // a slow disk
      try {
        let text = await fs.promises.readFile(params.path, "utf8");
        if (params.line != null || params.limit != null) {
          const lines = text.split("\n");
          const start = Math.max(0, (params.line ?? 1) - 1);
          const end = params.limit != null ? start + params.limit : lines.length;
          text = lines.slice(start, end).join("\n");
        }
        rec.ok = true;
        rec.chars = text.length;
        return { content: text };
      } catch (err) {
        rec.ok = false;
        rec.error = String(err.message || err);
        if (err.code === "ENOENT") throw acp.RequestError.resourceNotFound(params.path);
        throw acp.RequestError.internalError({ details: rec.error });
      }
    })
    .onRequest(acp.methods.client.fs.writeTextFile, async ({ params }) => {
      const rec = { t: now(), method: "fs/write_text_file", params: { ...params, content: undefined }, chars: (params.content || "").length };
      out.fileOps.push(rec);
      try {
        await fs.promises.writeFile(params.path, params.content, "utf8");
        rec.ok = true;
        return {};
      } catch (err) {
        rec.ok = false;
        rec.error = String(err.message || err);
        throw acp.RequestError.internalError({ details: rec.error });
      }
    })
    .onRequest("*", ({ method, params, requestId }) => {
      out.clientRequests.push({ t: now(), method, requestId, params });
      throw acp.RequestError.methodNotFound(method);
    })
    .onNotification("*", ({ method, params }) => {
      out.clientNotifications.push({ t: now(), method, params });
    });
}

// ---------------------------------------------------------------------------
// Steps.

const results = new Map(); // step id -> result
const background = new Map(); // step id -> {promise}
let stepTimeoutMs = 20000;

function resolveRefs(value) {
  if (typeof value === "string") {
    if (value.startsWith("$$")) return value.slice(1);
    const m = /^\$([A-Za-z_][\w-]*)((?:\.[\w-]+)*)$/.exec(value);
    if (!m) return value;
    if (!results.has(m[1])) throw new Error(`reference ${value}: no result from a step with id ${m[1]}`);
    let v = results.get(m[1]);
    for (const part of m[2].split(".").filter(Boolean)) {
      if (v === null || v === undefined) throw new Error(`reference ${value}: ${part} of ${safeJson(v)}`);
      v = v[part];
    }
    return v;
  }
  if (Array.isArray(value)) return value.map(resolveRefs);
  if (value && typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, resolveRefs(v)]));
  return value;
}

class StepTimeout extends Error {}
function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new StepTimeout(`${what}: no answer within ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function errorOf(err) {
  if (err instanceof StepTimeout) return { message: err.message, timeout: true };
  if (err && typeof err === "object" && "code" in err && typeof err.code === "number") return { code: err.code, message: err.message, data: err.data };
  return { message: String(err && err.message ? err.message : err) };
}

let exitInfo = null; // set when the child exits
const exited = new Promise((resolve) => bus.once("exit", resolve));

async function sdkRequest(method, params, rec, options) {
  const claim = expectRequestId(method);
  const p = agentCtx.request(method, params, options);
  claim.then(({ id, index }) => {
    rec.requestId = id;
    rec.requestIndex = index;
  });
  return p;
}

function promptBlocks(step) {
  if (step.prompt !== undefined) return typeof step.prompt === "string" ? [{ type: "text", text: step.prompt }] : step.prompt;
  if (step.text !== undefined) return [{ type: "text", text: step.text }];
  throw new Error("prompt step needs `prompt` (blocks) or `text`");
}

function normalizeCancelAfter(c) {
  if (c === undefined || c === null) return null;
  if (typeof c === "number") return { on: "ms", ms: c, count: 1 };
  if (typeof c === "string") return { on: c, count: 1 };
  const on = c.on ?? (c.ms !== undefined ? "ms" : c.update ?? (c.permission ? "permission" : undefined));
  return { ...c, on, count: c.count ?? 1 };
}

async function runPrompt(step, rec) {
  const sessionId = resolveRefs(step.sessionId);
  const blocks = resolveRefs(promptBlocks(step));
  const params = step.params ? resolveRefs(step.params) : { sessionId, prompt: blocks, ...(step._meta ? { _meta: step._meta } : {}) };
  if (step.permission !== undefined) permissionQueue = [].concat(step.permission);
  cancelledSessions.delete(params.sessionId);
  const cancelAfter = normalizeCancelAfter(step.cancelAfter);
  const via = step.via || cancelAfter?.via || "session";
  const abort = new AbortController();
  const startIndex = out.messages.length;
  let done = false;
  const cleanups = [];
  if (cancelAfter) {
    rec.cancel = { trigger: cancelAfter, sent: false };
    const fire = async (triggerIndex) => {
      if (done || rec.cancel.sent) return;
      rec.cancel.sent = true;
      rec.cancel.triggerIndex = triggerIndex;
      rec.cancel.indexBefore = out.messages.length; // the cancel is recorded at or after this index
      Object.assign(rec.cancel, await sendCancel(params.sessionId, via, abort, cancelAfter.on));
    };
    if (cancelAfter.on === "ms") {
      const timer = setTimeout(() => fire(null), cancelAfter.ms);
      cleanups.push(() => clearTimeout(timer));
    } else {
      let seen = 0;
      const onIn = (m) => {
        const msg = m.msg;
        if (!msg || typeof msg !== "object" || m.i < startIndex) return;
        let hit = false;
        if (cancelAfter.on === "permission") hit = msg.method === "session/request_permission" && msg.params?.sessionId === params.sessionId;
        else hit = msg.method === "session/update" && msg.params?.sessionId === params.sessionId && msg.params?.update?.sessionUpdate === cancelAfter.on;
        if (hit && ++seen >= cancelAfter.count) {
          if (cancelAfter.on === "permission") cancelledSessions.add(params.sessionId); // before the SDK hands the request to our handler
          void fire(m.i);
        }
      };
      bus.on("in", onIn);
      cleanups.push(() => bus.off("in", onIn));
    }
  }
  const options = via === "request" || via === "both" ? { cancellationSignal: abort.signal } : undefined;
  const p = sdkRequest(acp.methods.agent.session.prompt, params, rec, options).finally(() => {
    done = true;
    for (const c of cleanups) c();
    rec.responseIndex = rec.requestId !== undefined ? responseIndexFor(rec.requestId, rec.requestIndex ?? 0) : null;
    rec.settledAt = now();
  });
  return p;
}

const STEPS = {
  async initialize(step, rec) {
    const params = step.params
      ? resolveRefs(step.params)
      : {
          protocolVersion: step.protocolVersion ?? acp.PROTOCOL_VERSION,
          clientCapabilities: resolveRefs(step.clientCapabilities ?? {}),
          clientInfo: step.clientInfo ?? { name: "voice-acp-sdk-harness", title: "ACP SDK harness", version: out.sdk.version },
          ...(step._meta ? { _meta: step._meta } : {}),
        };
    return sdkRequest(acp.methods.agent.initialize, params, rec);
  },
  async newSession(step, rec) {
    const params = step.params
      ? resolveRefs(step.params)
      : {
          cwd: resolveRefs(step.cwd ?? process.cwd()),
          mcpServers: resolveRefs(step.mcpServers ?? []),
          ...(step.additionalDirectories ? { additionalDirectories: resolveRefs(step.additionalDirectories) } : {}),
          ...(step._meta ? { _meta: step._meta } : {}),
        };
    return sdkRequest(acp.methods.agent.session.new, params, rec);
  },
  async loadSession(step, rec) {
    const params = step.params
      ? resolveRefs(step.params)
      : { sessionId: resolveRefs(step.sessionId), cwd: resolveRefs(step.cwd ?? process.cwd()), mcpServers: resolveRefs(step.mcpServers ?? []) };
    rec.updatesBefore = out.updates.length;
    const r = await sdkRequest(acp.methods.agent.session.load, params, rec);
    return r;
  },
  async listSessions(step, rec) {
    const params = step.params
      ? resolveRefs(step.params)
      : { ...(step.cwd !== undefined ? { cwd: resolveRefs(step.cwd) } : {}), ...(step.cursor !== undefined ? { cursor: resolveRefs(step.cursor) } : {}) };
    return sdkRequest(acp.methods.agent.session.list, params, rec);
  },
  async request(step, rec) {
    return sdkRequest(step.method, resolveRefs(step.params ?? {}), rec);
  },
  async notify(step) {
    await agentCtx.notify(step.method, resolveRefs(step.params ?? {}));
    return null;
  },
  async prompt(step, rec) {
    const p = runPrompt(step, rec);
    if (step.background) {
      if (!step.id) throw new Error("a background prompt needs an id (for its await step)");
      p.catch(() => {});
      background.set(step.id, { promise: p, rec });
      await sleep(0);
      return { background: true };
    }
    return p;
  },
  async await(step, rec) {
    const b = background.get(step.ref);
    if (!b) throw new Error(`no background step with id ${step.ref}`);
    rec.of = step.ref;
    try {
      return await b.promise;
    } finally {
      rec.requestId = b.rec.requestId;
      rec.requestIndex = b.rec.requestIndex;
      rec.responseIndex = b.rec.responseIndex;
      if (b.rec.cancel) rec.cancel = b.rec.cancel;
    }
  },
  async cancel(step, rec) {
    const sessionId = resolveRefs(step.sessionId);
    rec.indexBefore = out.messages.length;
    Object.assign(rec, await sendCancel(sessionId, "session", null, "cancel step"));
    return null;
  },
  async permission(step) {
    permissionQueue = [].concat(step.policy ?? (step.optionId !== undefined ? { optionId: step.optionId } : "wait"));
    return { policy: permissionQueue };
  },
  async raw(step, rec) {
    const line = step.line !== undefined ? step.line : JSON.stringify(step.json);
    // The response looked for: `responseId`, else the id of the `json` sent, else null
    // (what a peer answers to a line it cannot parse or read as a request).
    const matchId =
      step.responseId !== undefined
        ? step.responseId
        : step.json && typeof step.json === "object" && !Array.isArray(step.json) && "id" in step.json
          ? step.json.id
          : null;
    rec.responseId = matchId;
    const expect = step.expectResponse ?? true;
    const waitMs = step.waitMs ?? (expect ? 3000 : 500);
    const from = out.messages.length;
    const sent = record("out", "raw", line);
    rec.sentIndex = from;
    await new Promise((resolve) => {
      if (!child.stdin.writable) {
        rec.writeError = sent.unsent = "the agent's stdin is closed";
        resolve();
        return;
      }
      child.stdin.write(line + (step.newline === false ? "" : "\n"), (err) => {
        if (err) rec.writeError = sent.unsent = String(err.message || err);
        resolve();
      });
    });
    const isAnswer = (m) => m.dir === "in" && m.msg && typeof m.msg === "object" && !Array.isArray(m.msg) && !("method" in m.msg) && isDeepStrictEqual(m.msg.id, matchId);
    let response = null;
    if (expect) {
      response = await new Promise((resolve) => {
        const found = out.messages.slice(from).find(isAnswer);
        if (found) return resolve(found);
        if (exitInfo) return resolve(null);
        const timer = setTimeout(() => finish(null), waitMs);
        const onIn = (m) => isAnswer(m) && finish(m);
        const onExit = () => finish(null);
        function finish(v) {
          clearTimeout(timer);
          bus.off("in", onIn);
          bus.off("exit", onExit);
          resolve(v);
        }
        bus.on("in", onIn);
        bus.once("exit", onExit);
      });
    } else {
      await Promise.race([sleep(waitMs), exited]);
    }
    const lines = out.messages.slice(from + 1).filter((m) => m.dir === "in").map((m) => m.i);
    return {
      response: response ? response.msg : null,
      responseIndex: response ? response.i : null,
      received: lines,
      agentExited: exitInfo,
    };
  },
  async waitMs(step) {
    await sleep(step.ms ?? 0);
    return null;
  },
  async waitFor(step, rec) {
    // Until `count` session/update of kind `update` (optionally for `sessionId`) were received since the start.
    const kind = step.update;
    const count = step.count ?? 1;
    const sessionId = step.sessionId !== undefined ? resolveRefs(step.sessionId) : undefined;
    const matches = () =>
      out.messages.filter(
        (m) => m.dir === "in" && m.msg?.method === "session/update" && m.msg.params?.update?.sessionUpdate === kind && (sessionId === undefined || m.msg.params?.sessionId === sessionId),
      ).length;
    while (matches() < count) {
      if (exitInfo) throw new Error("the agent exited");
      await new Promise((r) => {
        const wake = () => {
          clearTimeout(t);
          bus.off("in", wake);
          bus.off("exit", wake);
          r();
        };
        const t = setTimeout(wake, 50);
        bus.on("in", wake);
        bus.on("exit", wake);
      });
    }
    rec.index = out.messages.length - 1;
    return { count: matches() };
  },
  async close(step) {
    if (child.stdin.writable) child.stdin.end();
    await exited;
    return { code: exitInfo.code, signal: exitInfo.signal };
  },
  async expectExit(step, rec) {
    if (step.closeStdin && child.stdin.writable) child.stdin.end();
    await exited;
    if (step.code !== undefined && exitInfo.code !== step.code) {
      throw new Error(`the agent exited with ${exitInfo.code} (signal ${exitInfo.signal}), expected ${step.code}`);
    }
    return { code: exitInfo.code, signal: exitInfo.signal };
  },
  async kill(step) {
    child.kill(step.signal || "SIGTERM");
    await exited;
    return { code: exitInfo.code, signal: exitInfo.signal };
  },
};

// ---------------------------------------------------------------------------
// Main.

function groupAlive() {
  try {
    process.kill(-child.pid, 0);
    return true;
  } catch {
    return false;
  }
}

// At the end: stdin closed, then SIGTERM, then SIGKILL; `quick` (a signal or
// the total timeout) shortens the waits. The agent runs in its own process
// group; whatever of it is left then (its own children) is killed, and said.
async function finish(reason, quick = false) {
  if (finished) return;
  finished = true;
  try {
    if (child && child.pid && !exitInfo) {
      const grace = quick ? 300 : plan?.exitTimeoutMs ?? 5000;
      if (child.stdin.writable) child.stdin.end();
      let how = "stdin closed";
      const t = await Promise.race([exited.then(() => "exited"), sleep(grace).then(() => "timeout")]);
      if (t === "timeout") {
        how = "SIGTERM";
        child.kill("SIGTERM");
        const t2 = await Promise.race([exited.then(() => "exited"), sleep(quick ? 700 : 2000).then(() => "timeout")]);
        if (t2 === "timeout") {
          how = "SIGKILL";
          child.kill("SIGKILL");
          await Promise.race([exited, sleep(1000)]);
        }
      }
      if (exitInfo) exitInfo.how = exitInfo.how || `at the end (${how})`;
    }
    if (child && child.pid && groupAlive()) {
      out.oddities.push({ t: now(), where: "agent process group", note: "processes of the agent's group were still running at the end; killed (SIGKILL)" });
      try {
        process.kill(-child.pid, "SIGKILL");
      } catch {}
    }
  } catch (err) {
    driverError("finish", err);
  }
  try {
    validateAll();
  } catch (err) {
    driverError("validate", err);
  }
  out.stderr = Buffer.concat(stderrChunks).toString("utf8");
  out.exit = exitInfo;
  out.finishReason = reason;
  out.finishedAt = new Date().toISOString();
  out.ok = out.steps.every((s) => s.ok) && out.violations.length === 0 && out.driverErrors.length === 0;
  try {
    writeOutput();
  } catch (err) {
    process.stderr.write(`driver: cannot write ${outPath}: ${err}\n`);
  }
  if (child && !exitInfo) child.kill("SIGKILL");
  conn?.close();
  process.exit(0);
}

process.on("uncaughtException", (err) => driverError("uncaughtException", err));
process.on("unhandledRejection", (err) => driverError("unhandledRejection", err));
for (const sig of ["SIGTERM", "SIGINT", "SIGHUP"]) process.on(sig, () => void finish(`driver got ${sig}`, true));

try {
  plan = JSON.parse(fs.readFileSync(planPath, "utf8"));
} catch (err) {
  driverError("plan", err);
  await finish("bad plan");
}
stepTimeoutMs = plan.stepTimeoutMs ?? 20000;
if (plan.permission !== undefined) permissionQueue = [].concat(plan.permission);
const totalTimer = setTimeout(() => {
  driverError("total", `the plan did not finish within ${plan.totalTimeoutMs ?? 120000} ms`);
  void finish("total timeout", true);
}, plan.totalTimeoutMs ?? 120000);
totalTimer.unref?.();

out.argv = plan.argv;
try {
  child = spawn(plan.argv[0], plan.argv.slice(1), {
    cwd: plan.cwd || process.cwd(),
    env: plan.env || process.env,
    stdio: ["pipe", "pipe", "pipe"],
    detached: true, // its own process group, killed as a whole at the end
  });
} catch (err) {
  driverError("spawn", err);
  await finish("spawn failed");
}
child.on("error", (err) => {
  driverError("child", err);
  if (!exitInfo) {
    exitInfo = { code: null, signal: null, t: now(), how: `spawn error: ${err.message}` };
    bus.emit("exit", exitInfo);
  }
});
child.on("exit", (code, signal) => {
  if (!exitInfo) {
    exitInfo = { code, signal, t: now() };
    bus.emit("exit", exitInfo);
  }
});
child.stdin.on("error", (err) => out.oddities.push({ t: now(), where: "agent stdin", note: String(err.message || err) }));
child.stderr.on("data", (chunk) => {
  if (stderrBytes < STDERR_CAP) {
    stderrChunks.push(chunk);
    stderrBytes += chunk.length;
  }
});

// Tap both directions below the SDK's ndJsonStream.
const inSplit = lineSplitter((line) => record("in", "agent", line));
const agentOutput = new ReadableStream({
  start(controller) {
    child.stdout.on("data", (chunk) => {
      inSplit.push(chunk);
      controller.enqueue(new Uint8Array(chunk));
    });
    child.stdout.on("end", () => {
      inSplit.flush();
      try {
        controller.close();
      } catch {}
    });
    child.stdout.on("error", (err) => {
      try {
        controller.error(err);
      } catch {}
    });
  },
});
const outSplit = lineSplitter((line) => record("out", "sdk", line));
const agentInput = new WritableStream({
  write(chunk) {
    outSplit.push(chunk);
    return new Promise((resolve, reject) => {
      if (!child.stdin.writable) return reject(new Error("the agent's stdin is closed"));
      child.stdin.write(chunk, (err) => (err ? reject(err) : resolve()));
    });
  },
});

conn = buildClient().connect(acp.ndJsonStream(agentInput, agentOutput));
agentCtx = conn.agent;

let stop = false;
for (let n = 0; n < (plan.steps || []).length; n++) {
  const step = plan.steps[n];
  const rec = { index: n, type: step.type, id: step.id, startedAt: now() };
  out.steps.push(rec);
  if (stop) {
    rec.skipped = "an earlier step timed out";
    rec.ok = false;
    continue;
  }
  const fn = STEPS[step.type];
  try {
    if (!fn) throw new Error(`unknown step type ${step.type}`);
    const ms = step.timeoutMs ?? stepTimeoutMs;
    const result = await withTimeout(Promise.resolve().then(() => fn(step, rec)), ms, step.type);
    rec.ok = true;
    rec.result = result === undefined ? null : result;
    if (step.id) results.set(step.id, rec.result);
  } catch (err) {
    rec.ok = false;
    rec.error = errorOf(err);
    if (rec.error.timeout) {
      rec.timedOut = true;
      if (plan.stopAfterTimeout ?? true) stop = true;
    }
    if (step.id) results.set(step.id, null);
  }
  rec.endedAt = now();
  if (step.afterMs) await sleep(step.afterMs);
}
await finish("steps done");
