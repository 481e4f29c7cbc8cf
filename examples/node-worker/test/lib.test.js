'use strict';
// Unit tests of the worker's protocol helpers and model: `npm test` (node's own test runner).
const test = require('node:test');
const assert = require('node:assert/strict');
const lib = require('../lib');
const { parseArgs } = require('../worker');

const TENSORS = [
  { name: 'w', shape: [1, 8] },
  { name: 'b', shape: [1] },
];

test('layout hash is the one psproto.layout computes', () => {
  // Python: Layout.from_named_shapes([("w", (1, 8)), ("b", (1,))], num_shards).hash
  assert.equal(lib.layoutHash(TENSORS, 1), 'a3292dfe90004c6a84b93bcd5e4fbdd84fff72c8c80f61bfb69741fc7aa178b6');
  assert.equal(lib.layoutHash(TENSORS, 2), '2c4a42f4b43b5ff72371f9f77b1cdd051ec999253a32b0584e84fd988bd0fead');
  assert.equal(lib.totalLength(TENSORS), 9);
});

test('chunks are little-endian float32 with shard-relative offsets, and decode back', () => {
  const flat = Float64Array.from({ length: 9 }, (_, i) => i + 0.5);
  const chunks = lib.chunksOf(flat, 4, 5); // the second of two shards: elements 4..8
  assert.equal(chunks.length, 1);
  assert.equal(chunks[0].offset, 0);
  assert.equal(chunks[0].dtype, 'DTYPE_FLOAT32');
  assert.deepEqual([...chunks[0].data.subarray(0, 4)], [0x00, 0x00, 0x90, 0x40]); // 4.5f, little-endian
  const out = new Float64Array(9);
  assert.equal(lib.decodeChunk(chunks[0], out, 4, 5), 5);
  assert.deepEqual([...out.subarray(4)], [4.5, 5.5, 6.5, 7.5, 8.5]);
  assert.throws(() => lib.decodeChunk({ ...chunks[0], offset: 1 }, out, 4, 5), /does not fit/);
  assert.throws(() => lib.decodeChunk({ ...chunks[0], dtype: 'DTYPE_UNSPECIFIED' }, out, 4, 5), /unknown chunk dtype/);
});

test('large vectors are cut into chunks of at most 1 MiB', () => {
  const n = lib.MAX_CHUNK_ELEMENTS * 2 + 3;
  const chunks = lib.chunksOf(new Float64Array(n), 0, n);
  assert.deepEqual(chunks.map((c) => c.offset), [0, lib.MAX_CHUNK_ELEMENTS, 2 * lib.MAX_CHUNK_ELEMENTS]);
  assert.ok(chunks.every((c) => c.data.length <= 1 << 20));
});

test('bf16 and fp16 decode', () => {
  assert.equal(lib.bf16ToFloat(0x3fc0), 1.5);
  assert.equal(lib.fp16ToFloat(0x3e00), 1.5);
  assert.equal(lib.fp16ToFloat(0xc000), -2);
});

test('the gradient matches finite differences of the loss', () => {
  const data = lib.makeData(8, 64, 7);
  const params = lib.initialParameters(8, 3);
  const grad = new Float64Array(9);
  lib.lossAndGradient(params, data, 0, 64, grad);
  for (let k = 0; k < 9; k += 1) {
    const h = 1e-6;
    const plus = Float64Array.from(params);
    const minus = Float64Array.from(params);
    plus[k] += h;
    minus[k] -= h;
    const numeric = (lib.lossAndGradient(plus, data, 0, 64, null) - lib.lossAndGradient(minus, data, 0, 64, null)) / (2 * h);
    assert.ok(Math.abs(numeric - grad[k]) < 1e-6, `parameter ${k}: ${numeric} vs ${grad[k]}`);
  }
});

test('gradient descent on the generated data lowers the loss', () => {
  const data = lib.makeData(8, 512, 1);
  const params = lib.initialParameters(8, 1);
  const grad = new Float64Array(9);
  const first = lib.lossAndGradient(params, data, 0, 512, grad);
  for (let step = 0; step < 50; step += 1) {
    lib.lossAndGradient(params, data, 0, 512, grad);
    for (let k = 0; k < 9; k += 1) params[k] -= 0.5 * grad[k];
  }
  assert.ok(lib.lossAndGradient(params, data, 0, 512, null) < first / 2);
});

test('options', () => {
  const options = parseArgs(['--server', 'a:1', '--server', 'b:2', '--steps', '5', '--log-every', '2']);
  assert.deepEqual(options.server, ['a:1', 'b:2']);
  assert.equal(options.steps, 5);
  assert.equal(options.logEvery, 2);
  assert.throws(() => parseArgs(['--steps', '5']), /--server/);
  assert.throws(() => parseArgs(['--server', 'a:1', '--bogus', '1']), /unknown option/);
});
