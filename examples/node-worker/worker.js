#!/usr/bin/env node
'use strict';
// A hetps worker in Node.js, written against the .proto files under protos/ only.
//
// It trains logistic regression (tensors `w: [1, F]` and `b: [1]`) on data it generates:
// Join every shard, Init the parameters if nobody has, then repeat Pull -> gradient -> Push.
// Every --log-every steps it prints one JSON line with the loss of the parameters it pulled,
// measured on a fixed evaluation set, so the loss falling is visible in the log.
//
//   node worker.js --server 127.0.0.1:50051 [--server HOST:PORT ...] --steps 200
//
// Options (all optional but --server):
//   --server HOST:PORT   a shard; repeat once per shard, in shard order; a replicated shard as
//                        its replicas HOST:PORT|HOST:PORT (the worker finds and follows the primary)
//   --name NAME          worker name (default node-<host>-<pid>)
//   --features F         input features (default 8)
//   --steps N            local steps (default 200)
//   --until-clock C      stop once shard 0's clock reaches C (checked after each push)
//   --batch B            minibatch size (default 32)
//   --seed S             data and initial parameters (default 0)
//   --log-every K        print the evaluation loss every K steps (default 10)
//   --heartbeat-seconds  seconds between heartbeats (default 5)
//   --keepalive-seconds  HTTP/2 ping interval, at least 1: a silent link fails calls within 1.5x (default 10)
//   --push-dtype D       fp32 (default) or int8: 8-bit block pushes (docs/protocol.md); pulls stay fp32
//   --error-feedback 0|1 with int8 pushes, carry each push's quantisation error into the next (default 1)
//   --proto PATH         ps.proto (default ../../protos/psproto/v1/ps.proto next to this file)
//   --auth-token-file P  send `authorization: Bearer <token>` with every RPC
//   --tls-ca P           connect with TLS, trusting this CA (--tls-cert/--tls-key for mTLS)

// A refused call is recovered from by its reason (errors.js: re-join on UNKNOWN_WORKER, rebase a
// push on FUTURE_CLOCK, retry PUSH_STALLED, NAME_IN_USE and DRAINING, follow NOT_PRIMARY to the
// primary it names); any other refusal ends the worker with exit code 1, the status code and
// reason on stderr. A call to a replica set that got no answer goes to the next replica.

const os = require('node:os');
const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const lib = require('./lib');
const errors = require('./errors');

// How long one call keeps recovering from refusals (re-join, rebase, retry, follow) before giving up.
const RECOVERY_SECONDS = 60;
// The pause before a call goes to another replica: fixed, not the growing backoff, so a failover
// costs no more than the election (the Python client's FOLLOW_PAUSE_S).
const FOLLOW_PAUSE_MS = 100;
// Separates the replicas of one shard in a --server entry.
const REPLICA_SEPARATOR = '|';

const DEFAULT_PROTO = path.resolve(__dirname, '..', '..', 'protos', 'psproto', 'v1', 'ps.proto');

function parseArgs(argv) {
  const options = {
    server: [],
    name: `node-${os.hostname()}-${process.pid}`,
    features: 8,
    steps: 200,
    untilClock: 0,
    batch: 32,
    seed: 0,
    logEvery: 10,
    heartbeatSeconds: 5,
    keepaliveSeconds: 10,
    proto: DEFAULT_PROTO,
    authTokenFile: '',
    tlsCa: '',
    tlsCert: '',
    tlsKey: '',
    pushDtype: 'fp32',
    errorFeedback: 1,
  };
  const numeric = new Set([
    'features',
    'steps',
    'untilClock',
    'batch',
    'seed',
    'logEvery',
    'heartbeatSeconds',
    'keepaliveSeconds',
    'errorFeedback',
  ]);
  for (let i = 0; i < argv.length; i += 1) {
    const flag = argv[i];
    if (flag === '--help' || flag === '-h') {
      // The comment block that opens this file, up to its first blank line.
      const lines = fs.readFileSync(__filename, 'utf8').split('\n').slice(2);
      const usage = lines.slice(0, lines.findIndex((line) => !line.startsWith('//')));
      process.stdout.write(usage.join('\n').replace(/^\/\/ ?/gm, '') + '\n');
      process.exit(0);
    }
    if (!flag.startsWith('--') || i + 1 >= argv.length) throw new Error(`unexpected argument ${flag}`);
    const key = flag.slice(2).replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (!(key in options)) throw new Error(`unknown option ${flag}`);
    const value = argv[(i += 1)];
    if (key === 'server') options.server.push(value);
    else if (numeric.has(key)) {
      options[key] = Number(value);
      if (!Number.isFinite(options[key]) || options[key] < 0) throw new Error(`${flag} needs a number >= 0`);
    } else options[key] = value;
  }
  if (options.server.length === 0) throw new Error('give at least one --server HOST:PORT');
  options.replicas = replicaSets(options.server);
  // The server accepts a ping every 0.5 s at most; faster ones earn GOAWAY too_many_pings.
  if (options.keepaliveSeconds < 1) throw new Error('--keepalive-seconds needs a number >= 1');
  if (!['fp32', 'int8'].includes(options.pushDtype)) throw new Error('--push-dtype is fp32 or int8');
  return options;
}

// Each --server entry's replica set; an empty member or an address given twice is an Error naming it.
function replicaSets(entries) {
  const sets = entries.map((entry) => entry.split(REPLICA_SEPARATOR).map((member) => member.trim()));
  sets.forEach((members, i) => {
    if (members.includes('')) {
      throw new Error(`--server ${JSON.stringify(entries[i])} has an empty address; give HOST:PORT, or a shard's replicas as HOST:PORT|HOST:PORT`);
    }
  });
  const addresses = sets.flat();
  const repeated = [...new Set(addresses.filter((a, i) => addresses.indexOf(a) !== i))].sort();
  if (repeated.length > 0) {
    throw new Error(`--server ${repeated.join(', ')} listed more than once; give each shard's address once, and each replica in one set only`);
  }
  return sets;
}

function loadService(protoPath) {
  const definition = protoLoader.loadSync(protoPath, {
    keepCase: true, // field names exactly as in ps.proto (worker_id, shard_offset, ...)
    longs: Number, // uint64 clocks and offsets stay far below 2^53
    enums: String,
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).psproto.v1.ParameterServer;
}

function credentialsFor(options) {
  if (!options.tlsCa) return grpc.credentials.createInsecure();
  const read = (p) => (p ? fs.readFileSync(p) : null);
  return grpc.credentials.createSsl(read(options.tlsCa), read(options.tlsKey), read(options.tlsCert));
}

function metadataFor(options) {
  const metadata = new grpc.Metadata();
  if (options.authTokenFile) {
    metadata.set('authorization', `Bearer ${fs.readFileSync(options.authTokenFile, 'utf8').trim()}`);
  }
  return metadata;
}

// Promise wrappers over the four kinds of call.
function unary(client, method, request, metadata) {
  return new Promise((resolve, reject) => {
    client[method](request, metadata, { deadline: Date.now() + 60_000 }, (error, reply) =>
      error ? reject(error) : resolve(reply),
    );
  });
}

function clientStream(client, method, messages, metadata) {
  return new Promise((resolve, reject) => {
    const call = client[method](metadata, { deadline: Date.now() + 60_000 }, (error, reply) =>
      error ? reject(error) : resolve(reply),
    );
    for (const message of messages) call.write(message);
    call.end();
  });
}

function serverStream(client, method, request, metadata, onMessage) {
  return new Promise((resolve, reject) => {
    const call = client[method](request, metadata, { deadline: Date.now() + 60_000 });
    call.on('data', onMessage);
    call.on('error', reject);
    call.on('end', resolve);
  });
}

function describe(error) {
  const code = Object.keys(grpc.status).find((name) => grpc.status[name] === error.code) || error.code;
  const reason = errors.reasonOf(error);
  return `${code}${reason ? ` (${reason})` : ''}: ${error.details || error.message}`;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

class Worker {
  constructor(options) {
    this.options = options;
    this.tensors = [
      { name: 'w', shape: [1, options.features] },
      { name: 'b', shape: [1] },
    ];
    this.numShards = options.replicas.length;
    this.layoutHash = lib.layoutHash(this.tensors, this.numShards);
    this.length = lib.totalLength(this.tensors);
    this.params = new Float64Array(this.length);
    this.grad = new Float64Array(this.length);
    this.metadata = metadataFor(options);
    this.Service = loadService(options.proto);
    this.credentials = credentialsFor(options);
    // Keepalive pings, between calls too, so a link that went silent (no RST, no FIN) fails the
    // calls on it within 1.5 intervals instead of hanging them (the Python client does the same).
    const keepaliveMs = Math.round(options.keepaliveSeconds * 1000);
    this.channelOptions = {
      'grpc.max_receive_message_length': 64 << 20,
      'grpc.max_send_message_length': 64 << 20,
      'grpc.keepalive_time_ms': keepaliveMs,
      'grpc.keepalive_timeout_ms': Math.round(keepaliveMs / 2),
      'grpc.keepalive_permit_without_calls': 1,
    };
    // Each shard starts at the first of its replicas; `address` is the one its calls go to.
    this.shards = options.replicas.map((replicas) => ({ replicas, address: replicas[0], client: this.connect(replicas[0]) }));
    this.pushId = 0;
    this.follows = 0;
  }

  connect(address) {
    return new this.Service(address, this.credentials, this.channelOptions);
  }

  // Send `shard`'s calls to `address` from now on: another replica of its set, over a new channel.
  follow(shard, address, error) {
    this.log('followed', {
      shard: this.shards.indexOf(shard),
      from: shard.address,
      to: address,
      reason: errors.reasonOf(error),
      why: describe(error),
    });
    shard.client.close();
    Object.assign(shard, { address, client: this.connect(address) });
    this.follows += 1;
  }

  log(event, fields) {
    process.stdout.write(`${JSON.stringify({ event, worker: this.options.name, ...fields })}\n`);
  }

  // Run `call` against one shard, recovering from a refusal as its reason says (errors.js);
  // a refusal to give up on, or one that lasts RECOVERY_SECONDS, is thrown.
  async recovering(shard, call) {
    const deadline = Date.now() + RECOVERY_SECONDS * 1000;
    let backoffMs = 100;
    let unanswered = 0; // calls in a row that got no answer: once every replica gave none, back off
    for (;;) {
      try {
        return await call();
      } catch (error) {
        const reason = errors.reasonOf(error);
        const action = errors.recoveryFor(error, shard.replicas.length);
        if (action === errors.Action.GIVE_UP || Date.now() >= deadline) throw error;
        this.log('recovering', { shard: this.shards.indexOf(shard), reason, action });
        unanswered = action === errors.Action.FOLLOW && reason === null ? unanswered + 1 : 0;
        if (action === errors.Action.FOLLOW) {
          const address = errors.nextAddress(error, shard.replicas, shard.address);
          // A lone replica that names no primary yet (an election) answered: it is asked again as it is.
          if (address !== shard.address) this.follow(shard, address, error);
          if (unanswered < shard.replicas.length) {
            await sleep(FOLLOW_PAUSE_MS);
            continue;
          }
        }
        if (action === errors.Action.REJOIN) {
          await this.recovering(shard, () => this.joinShard(shard, true));
        } else if (action === errors.Action.REBASE) {
          // Push against the shard's clock now: the clock the update was computed on is gone.
          const reply = await unary(shard.client, 'Heartbeat', { worker_id: shard.workerId }, this.metadata);
          shard.pulledClock = Math.min(shard.pulledClock, reply.clock);
        } else {
          await sleep(backoffMs * (0.5 + Math.random() / 2));
          backoffMs = Math.min(backoffMs * 2, 2000);
        }
      }
    }
  }

  // Join one shard; `resume` takes over this worker's own record (and its push ids) if the shard still has it.
  async joinShard(shard, resume) {
    const request = {
      worker_name: this.options.name,
      device: 'cpu (node.js)',
      role: 'ROLE_WORKER',
      layout: { tensors: this.tensors, num_shards: this.numShards },
      layout_hash: this.layoutHash,
      resume,
    };
    const reply = await unary(shard.client, 'Join', request, this.metadata);
    shard.workerId = reply.worker_id;
    // The shard may have lost updates the error-feedback residual assumed applied: start it again at 0.
    shard.residual = null;
    if (resume) this.log('rejoined', { shard: this.shards.indexOf(shard), worker_id: reply.worker_id, clock: reply.clock });
    return reply;
  }

  async join() {
    let offset = 0;
    for (const [index, shard] of this.shards.entries()) {
      // A single server is waited for; a replica of a set is not, as another one may be up.
      if (shard.replicas.length === 1) {
        await new Promise((resolve, reject) =>
          shard.client.waitForReady(Date.now() + 30_000, (error) => (error ? reject(error) : resolve())),
        );
      }
      const reply = await this.recovering(shard, () => this.joinShard(shard, false));
      if (reply.shard_index !== index || reply.shard_offset !== offset) {
        throw new Error(`${shard.address} serves shard ${reply.shard_index} at ${reply.shard_offset}; list the servers in shard order`);
      }
      if (reply.rule.worker_procedure !== 'gradient') {
        throw new Error(
          `the server's rule ${reply.rule.name} asks for the worker procedure "${reply.rule.worker_procedure}"; ` +
            'this worker implements only "gradient" (see docs/protocol.md)',
        );
      }
      Object.assign(shard, {
        offset: reply.shard_offset,
        length: reply.shard_length,
        clock: reply.clock,
        initialized: reply.initialized,
        lease: reply.lease_seconds,
      });
      offset += reply.shard_length;
      this.log('joined', { shard: index, worker_id: reply.worker_id, rule: reply.rule.name, clock: reply.clock });
    }
    if (offset !== this.length) throw new Error(`the shards hold ${offset} elements; the model has ${this.length}`);
  }

  async init() {
    const initial = lib.initialParameters(this.options.features, this.options.seed + 1);
    for (const shard of this.shards) {
      if (shard.initialized) continue;
      const chunks = lib.chunksOf(initial, shard.offset, shard.length);
      // Built at each attempt, and sent to the shard's current replica (a failover may come between).
      const send = () => {
        const header = { worker_id: shard.workerId, layout_hash: this.layoutHash };
        return clientStream(shard.client, 'Init', [{ header }, ...chunks.map((chunk) => ({ chunk }))], this.metadata);
      };
      const reply = await this.recovering(shard, send);
      this.log('init', { shard: this.shards.indexOf(shard), applied: reply.applied, clock: reply.clock });
    }
  }

  async pull() {
    await Promise.all(
      this.shards.map(async (shard) => {
        let received = 0;
        await this.recovering(shard, () => {
          received = 0;
          return serverStream(
            shard.client,
            'Pull',
            { worker_id: shard.workerId, wire_dtype: 'DTYPE_FLOAT32' },
            this.metadata,
            (message) => {
              shard.pulledClock = message.clock;
              received += lib.decodeChunk(message.chunk, this.params, shard.offset, shard.length);
            },
          );
        });
        if (received !== shard.length) throw new Error(`pulled ${received} of ${shard.length} elements`);
      }),
    );
  }

  async push() {
    this.pushId += 1; // unique per worker: a retried push with the same id is never applied twice
    const pushId = this.pushId;
    return Promise.all(
      this.shards.map((shard) => {
        const chunks = this.pushChunks(shard); // encoded once: a retry resends the same bytes
        // Built at each attempt: a re-join changes the worker id, a rebase the base clock.
        const send = () => {
          const header = {
            worker_id: shard.workerId,
            push_id: pushId,
            base_clock: shard.pulledClock, // the clock of the parameters this gradient was computed on
            kind: 'PAYLOAD_KIND_GRADIENT',
            layout_hash: this.layoutHash,
          };
          return clientStream(shard.client, 'Push', [{ header }, ...chunks.map((chunk) => ({ chunk }))], this.metadata);
        };
        return this.recovering(shard, send);
      }),
    );
  }

  pushChunks(shard) {
    if (this.options.pushDtype !== 'int8') return lib.chunksOf(this.grad, shard.offset, shard.length);
    if (this.options.errorFeedback && !shard.residual) shard.residual = new Float32Array(shard.length);
    return lib.int8ChunksOf(this.grad, shard.offset, shard.length, this.options.errorFeedback ? shard.residual : null);
  }

  async heartbeat(stats) {
    await Promise.all(
      this.shards.map((shard) =>
        this.recovering(shard, () => unary(shard.client, 'Heartbeat', { worker_id: shard.workerId, stats }, this.metadata)),
      ),
    );
  }

  async leave() {
    await Promise.allSettled(
      this.shards.map((shard) => unary(shard.client, 'Leave', { worker_id: shard.workerId }, this.metadata)),
    );
    for (const shard of this.shards) shard.client.close();
  }

  async run() {
    const { features, steps, batch, seed, logEvery, untilClock } = this.options;
    const train = lib.makeData(features, 4096, 1000 + seed);
    const evaluation = lib.makeData(features, 1024, 999_999); // the same for every worker
    await this.join();
    await this.init();
    const losses = [];
    let computeSeconds = 0;
    let lastHeartbeat = Date.now();
    let staleness = 0;
    let clock = 0;
    let step = 0;
    for (step = 1; step <= steps; step += 1) {
      await this.pull();
      const started = process.hrtime.bigint();
      const from = ((step - 1) * batch) % (train.count - batch + 1);
      const batchLoss = lib.lossAndGradient(this.params, train, from, from + batch, this.grad);
      computeSeconds += Number(process.hrtime.bigint() - started) / 1e9;
      if (step === 1 || step % logEvery === 0) {
        const loss = lib.lossAndGradient(this.params, evaluation, 0, evaluation.count, null);
        losses.push(loss);
        this.log('step', { step, loss, batch_loss: batchLoss, clock: this.shards[0].pulledClock, staleness });
      }
      const replies = await this.push();
      staleness = Math.max(...replies.map((r) => Number(r.staleness)));
      clock = Math.min(...replies.map((r) => Number(r.clock)));
      if (Date.now() - lastHeartbeat > this.options.heartbeatSeconds * 1000) {
        await this.heartbeat({ compute_seconds: computeSeconds / step, samples_per_second: (batch * step) / computeSeconds });
        lastHeartbeat = Date.now();
      }
      if (untilClock && clock >= untilClock) break;
    }
    await this.pull();
    const finalLoss = lib.lossAndGradient(this.params, evaluation, 0, evaluation.count, null);
    losses.push(finalLoss);
    this.log('done', {
      pushes: this.pushId,
      follows: this.follows,
      clock,
      first_loss: losses[0],
      final_loss: finalLoss,
      weights: Array.from(this.params, (v) => Number(v.toFixed(4))),
    });
    await this.leave();
  }
}

async function main() {
  let options;
  try {
    options = parseArgs(process.argv.slice(2));
  } catch (error) {
    process.stderr.write(`hetps-node-worker: ${error.message} (--help lists the options)\n`);
    process.exit(2);
  }
  const worker = new Worker(options);
  try {
    await worker.run();
  } catch (error) {
    process.stderr.write(`hetps-node-worker: ${error.code !== undefined ? describe(error) : error.message}\n`);
    await worker.leave().catch(() => {});
    process.exit(1);
  }
}

if (require.main === module) main();

module.exports = { Worker, parseArgs, replicaSets };
