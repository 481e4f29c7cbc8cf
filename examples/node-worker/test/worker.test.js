'use strict';
// The worker acting on its recovery decisions, with calls that fail as a replica set's would: no
// server is needed, as the channels connect only when a call is made on them.
const test = require('node:test');
const assert = require('node:assert/strict');
const { Worker, parseArgs } = require('../worker');
const { noAnswer, notPrimary } = require('./refusals');

function quietWorker(...servers) {
  const worker = new Worker(parseArgs(servers.flatMap((server) => ['--server', server])));
  const events = [];
  worker.log = (event, fields) => events.push({ event, ...fields });
  return { worker, events };
}

// A call that fails with each of `errors` in turn, then answers with the address it was sent to.
function failing(shard, errors) {
  const addresses = [];
  const call = async () => {
    addresses.push(shard.address);
    if (addresses.length <= errors.length) throw errors[addresses.length - 1];
    return shard.address;
  };
  return { call, addresses };
}

test('a call follows NOT_PRIMARY to the named primary, and an election to the next replica, after 0.1 s each', async () => {
  const { worker, events } = quietWorker('a:1|b:1|c:1');
  const shard = worker.shards[0];
  const { call, addresses } = failing(shard, [notPrimary(''), notPrimary('a:1')]);
  const started = Date.now();
  assert.equal(await worker.recovering(shard, call), 'a:1');
  assert.ok(Date.now() - started >= 190, 'two pauses of 0.1 s');
  assert.deepEqual(addresses, ['a:1', 'b:1', 'a:1']);
  const followed = events.filter((e) => e.event === 'followed').map((e) => [e.from, e.to, e.reason]);
  assert.deepEqual(followed, [['a:1', 'b:1', 'NOT_PRIMARY'], ['b:1', 'a:1', 'NOT_PRIMARY']]);
  assert.equal(worker.follows, 2);
  worker.shards.forEach((s) => s.client.close());
});

test('a replica without an answer is passed for the next; a whole set without one is backed off from', async () => {
  const { worker } = quietWorker('a:1|b:1');
  const shard = worker.shards[0];
  const { call, addresses } = failing(shard, Array.from({ length: 5 }, noAnswer));
  const started = Date.now();
  assert.equal(await worker.recovering(shard, call), 'b:1');
  assert.deepEqual(addresses, ['a:1', 'b:1', 'a:1', 'b:1', 'a:1', 'b:1']);
  // 0.1 s to b; then, every replica having given no answer, the growing backoff: 50-100, 100-200,
  // 200-400 and 400-800 ms (fixed pauses alone would take 0.5 s).
  assert.ok(Date.now() - started >= 100 + 50 + 100 + 200 + 400);
  assert.equal(worker.follows, 5);
  worker.shards.forEach((s) => s.client.close());
});

test('a lone server that names no primary keeps its channel; without an answer it ends the worker as before', async () => {
  const { worker, events } = quietWorker('a:1');
  const shard = worker.shards[0];
  const client = shard.client;
  const { call, addresses } = failing(shard, [notPrimary('')]);
  assert.equal(await worker.recovering(shard, call), 'a:1');
  assert.deepEqual(addresses, ['a:1', 'a:1']);
  assert.equal(shard.client, client);
  assert.equal(events.filter((e) => e.event === 'followed').length, 0);
  const down = failing(shard, [noAnswer()]);
  await assert.rejects(worker.recovering(shard, down.call), (error) => error.details === 'No connection established');
  assert.deepEqual(down.addresses, ['a:1']);
  shard.client.close();
});
