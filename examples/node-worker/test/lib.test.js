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

test('a --server entry is one shard: its address, or its replicas joined by |', () => {
  const options = parseArgs(['--server', 'a:1|b:1| c:1 ', '--server', 'd:1']);
  assert.deepEqual(options.replicas, [['a:1', 'b:1', 'c:1'], ['d:1']]);
  assert.throws(() => parseArgs(['--server', 'a:1|']), /--server "a:1\|" has an empty address; give HOST:PORT, or a shard's replicas/);
  assert.throws(() => parseArgs(['--server', 'a:1||b:1']), /has an empty address/);
  assert.throws(() => parseArgs(['--server', 'a:1|b:1', '--server', 'b:1']), /--server b:1 listed more than once/);
  assert.throws(() => parseArgs(['--server', 'a:1|a:1']), /a:1 listed more than once/);
});

test('8-bit blocks encode as psproto.blocks does', () => {
  // Python: psproto.blocks.encode(torch.tensor([...])) gives these values and float32 scales.
  const cases = [
    [[0.25, -2.54, 1.0, 0.0, 0.01, 1.27], [12, -127, 50, 0, 0, 64], '0ad7a33c'],
    [[127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5], [127, 0, 2, 2, 0, -2, -2], '0000803f'], // ties go to even
  ];
  for (const [values, q, scales] of cases) {
    const decoded = new Float32Array(values.length);
    const encoded = lib.encodeBlocks(Float32Array.from(values), decoded);
    assert.deepEqual([...new Int8Array(encoded.data.buffer, encoded.data.byteOffset, values.length)], q);
    assert.equal(encoded.scales.toString('hex'), scales);
    const s = encoded.scales.readFloatLE(0);
    values.forEach((x, i) => assert.ok(Math.abs(Math.fround(x) - decoded[i]) <= s / 2 + 1e-7, `${x} vs ${decoded[i]}`));
  }
  const zeros = lib.encodeBlocks(new Float32Array(5), new Float32Array(5));
  assert.equal(zeros.scales.readFloatLE(0), 0);
  assert.deepEqual([...zeros.data], [0, 0, 0, 0, 0]);
});

test('8-bit chunks hold whole blocks, one scale per block, and error feedback keeps the sums together', () => {
  const length = lib.MAX_INT8_CHUNK_ELEMENTS + lib.BLOCK + 7;
  const flat = new Float64Array(length + 3);
  const random = lib.rng(5);
  const residual = new Float32Array(length);
  const trueSum = new Float64Array(length);
  const sentSum = new Float64Array(length);
  for (let push = 0; push < 3; push += 1) {
    for (let i = 0; i < flat.length; i += 1) flat[i] = Math.fround(random() - 0.5);
    const chunks = lib.int8ChunksOf(flat, 3, length, residual);
    assert.deepEqual(chunks.map((c) => c.offset), [0, lib.MAX_INT8_CHUNK_ELEMENTS]);
    assert.deepEqual(chunks.map((c) => c.scales.length / 4), [lib.MAX_INT8_CHUNK_ELEMENTS / lib.BLOCK, 2]);
    assert.ok(chunks.every((c) => c.dtype === 'DTYPE_INT8_BLOCK' && c.data.length + c.scales.length <= 1 << 20));
    for (const chunk of chunks) {
      for (let i = 0; i < chunk.data.length; i += 1) {
        const scale = chunk.scales.readFloatLE(Math.floor(i / lib.BLOCK) * 4);
        sentSum[chunk.offset + i] += chunk.data.readInt8(i) * scale;
      }
    }
    for (let i = 0; i < length; i += 1) trueSum[i] += flat[3 + i];
  }
  // Σp − Σx̂ is the residual alone, and the residual is within half a step (max|p + e| is about 0.5 here).
  for (let i = 0; i < length; i += 1) {
    assert.ok(Math.abs(trueSum[i] - sentSum[i] - residual[i]) < 1e-5, `element ${i}`);
    assert.ok(Math.abs(residual[i]) <= 0.51 / 127 / 2, `element ${i}: ${residual[i]}`);
  }
});

test('push dtype option', () => {
  assert.equal(parseArgs(['--server', 'a:1']).pushDtype, 'fp32');
  const options = parseArgs(['--server', 'a:1', '--push-dtype', 'int8', '--error-feedback', '0']);
  assert.equal(options.pushDtype, 'int8');
  assert.equal(options.errorFeedback, 0);
  assert.throws(() => parseArgs(['--server', 'a:1', '--push-dtype', 'bf16']), /--push-dtype is fp32 or int8/);
});
