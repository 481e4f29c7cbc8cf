'use strict';
// The parts of a hetps client that are not gRPC: the layout, its hash, the wire format of
// chunks, and the model (logistic regression in plain JavaScript). See docs/protocol.md.

const crypto = require('node:crypto');

// ---- layout ------------------------------------------------------------------------------

// A model is an ordered list of named tensors; the flat vector concatenates them in order.
// Shards are contiguous ranges of that vector, told to the client by each shard's Join reply.
function layoutHash(tensors, numShards) {
  const text = tensors.map((t) => `${t.name}:${t.shape.join(',')}`).join(';');
  return crypto.createHash('sha256').update(`${text}|${numShards}`, 'utf8').digest('hex');
}

function numel(shape) {
  return shape.reduce((a, b) => a * b, 1);
}

function totalLength(tensors) {
  return tensors.reduce((sum, t) => sum + numel(t.shape), 0);
}

// ---- chunks: little-endian float32, offsets in elements relative to the shard ------------

const MAX_CHUNK_ELEMENTS = (1 << 20) / 4; // 1 MiB of float32 per message

function encodeFloat32(values, start, end) {
  const buffer = Buffer.allocUnsafe((end - start) * 4);
  for (let i = start; i < end; i += 1) buffer.writeFloatLE(values[i], (i - start) * 4);
  return buffer;
}

// The chunks covering flat[offset, offset + length): [{offset (relative), dtype, data}].
function chunksOf(flat, offset, length) {
  const chunks = [];
  for (let start = 0; start < length; start += MAX_CHUNK_ELEMENTS) {
    const end = Math.min(length, start + MAX_CHUNK_ELEMENTS);
    chunks.push({ offset: start, dtype: 'DTYPE_FLOAT32', data: encodeFloat32(flat, offset + start, offset + end) });
  }
  return chunks;
}

// ---- 8-bit pushes (DTYPE_INT8_BLOCK, docs/protocol.md "8-bit pushes") ---------------------
// Blocks of BLOCK values from each chunk's offset; per block s = max|x| / 127 and
// q = clamp(round_half_even(x / s), -127, 127), all in float32 (Math.fround), as psproto.blocks.

const BLOCK = 4096;
// Whole blocks and their scales in at most 1 MiB per message.
const MAX_INT8_CHUNK_ELEMENTS = Math.floor((1 << 20) / (BLOCK + 4)) * BLOCK;
const SMALLEST_FLOAT32 = 2 ** -149;

function roundHalfEven(v) {
  const floor = Math.floor(v);
  const rest = v - floor;
  if (rest < 0.5) return floor;
  if (rest > 0.5) return floor + 1;
  return floor % 2 === 0 ? floor : floor + 1;
}

// Encode float32 values x[0, n) as one chunk's {data, scales} and write x̂ = q·s into `decoded`.
function encodeBlocks(x, decoded) {
  const n = x.length;
  const data = Buffer.allocUnsafe(n);
  const scales = Buffer.allocUnsafe(Math.ceil(n / BLOCK) * 4);
  for (let start = 0, block = 0; start < n; start += BLOCK, block += 1) {
    const end = Math.min(n, start + BLOCK);
    let largest = 0;
    for (let i = start; i < end; i += 1) largest = Math.max(largest, Math.abs(x[i])); // NaN stays NaN
    let s = Math.fround(largest / 127);
    if (s === 0 && largest > 0) s = SMALLEST_FLOAT32; // max|x| / 127 underflowed: keep a positive step
    scales.writeFloatLE(s, block * 4);
    for (let i = start; i < end; i += 1) {
      const q = s > 0 ? Math.min(127, Math.max(-127, roundHalfEven(Math.fround(x[i] / s)))) : 0;
      data.writeInt8(Number.isNaN(q) ? 0 : q, i);
      decoded[i] = Math.fround(q * s);
    }
  }
  return { data, scales };
}

// The DTYPE_INT8_BLOCK chunks of flat[offset, offset + length). With a `residual` (a Float32Array
// of `length`, the shard's error feedback, starting at 0) it sends Q(p + e) and sets e ← (p + e) − x̂;
// the residual is left as it was when a scale is not finite (the server refuses that push).
function int8ChunksOf(flat, offset, length, residual) {
  const target = new Float32Array(length);
  for (let i = 0; i < length; i += 1) target[i] = flat[offset + i] + (residual ? residual[i] : 0);
  const decoded = new Float32Array(length);
  const chunks = [];
  let finite = true;
  for (let start = 0; start < length; start += MAX_INT8_CHUNK_ELEMENTS) {
    const end = Math.min(length, start + MAX_INT8_CHUNK_ELEMENTS);
    const { data, scales } = encodeBlocks(target.subarray(start, end), decoded.subarray(start, end));
    for (let k = 0; k < scales.length; k += 4) finite = finite && Number.isFinite(scales.readFloatLE(k));
    chunks.push({ offset: start, dtype: 'DTYPE_INT8_BLOCK', data, scales });
  }
  if (residual && finite) for (let i = 0; i < length; i += 1) residual[i] = target[i] - decoded[i];
  return chunks;
}

function bf16ToFloat(bits) {
  const view = new DataView(new ArrayBuffer(4));
  view.setUint32(0, bits << 16, true);
  return view.getFloat32(0, true);
}

function fp16ToFloat(bits) {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const fraction = bits & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 31) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

// Write a received chunk into flat[shardOffset + chunk.offset, ...]; returns the element count.
function decodeChunk(chunk, flat, shardOffset, shardLength) {
  const data = chunk.data;
  const start = Number(chunk.offset);
  let count;
  let read;
  if (chunk.dtype === 'DTYPE_FLOAT32') {
    count = data.length / 4;
    read = (i) => data.readFloatLE(i * 4);
  } else if (chunk.dtype === 'DTYPE_BFLOAT16') {
    count = data.length / 2;
    read = (i) => bf16ToFloat(data.readUInt16LE(i * 2));
  } else if (chunk.dtype === 'DTYPE_FLOAT16') {
    count = data.length / 2;
    read = (i) => fp16ToFloat(data.readUInt16LE(i * 2));
  } else {
    throw new Error(`unknown chunk dtype ${chunk.dtype}`);
  }
  if (!Number.isInteger(count) || start + count > shardLength) {
    throw new Error(`chunk [${start}, ${start + count}) does not fit the shard of ${shardLength} elements`);
  }
  for (let i = 0; i < count; i += 1) flat[shardOffset + start + i] = read(i);
  return count;
}

// ---- data and model ----------------------------------------------------------------------

// mulberry32: a small seeded generator, so every run (and every language) can make the same data.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function gaussian(random) {
  const u = Math.max(random(), 1e-12);
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * random());
}

// The task: y = 1 when w*·x + b* > 0, with w*_j = (-1)^j (1 + j / F) and b* = 0.25, x ~ N(0, I).
function trueParameters(features) {
  const w = Array.from({ length: features }, (_, j) => (j % 2 === 0 ? 1 : -1) * (1 + j / features));
  return { w, b: 0.25 };
}

function makeData(features, count, seed) {
  const random = rng(seed);
  const truth = trueParameters(features);
  const x = new Float64Array(count * features);
  const y = new Float64Array(count);
  for (let n = 0; n < count; n += 1) {
    let z = truth.b;
    for (let j = 0; j < features; j += 1) {
      const v = gaussian(random);
      x[n * features + j] = v;
      z += truth.w[j] * v;
    }
    y[n] = z > 0 ? 1 : 0;
  }
  return { x, y, count, features };
}

function sigmoid(z) {
  return z >= 0 ? 1 / (1 + Math.exp(-z)) : Math.exp(z) / (1 + Math.exp(z));
}

// Mean binary cross-entropy of samples [from, to) and, when `grad` is given, its gradient
// written into grad (w first, then b: the layout's order).
function lossAndGradient(params, data, from, to, grad) {
  const F = data.features;
  const n = to - from;
  if (grad) grad.fill(0);
  let loss = 0;
  for (let s = from; s < to; s += 1) {
    let z = params[F];
    for (let j = 0; j < F; j += 1) z += params[j] * data.x[s * F + j];
    const p = sigmoid(z);
    const y = data.y[s];
    // log(1 + e^z) - y z, stable for large |z|
    loss += (z > 0 ? z + Math.log1p(Math.exp(-z)) : Math.log1p(Math.exp(z))) - y * z;
    if (grad) {
      const r = (p - y) / n;
      for (let j = 0; j < F; j += 1) grad[j] += r * data.x[s * F + j];
      grad[F] += r;
    }
  }
  return loss / n;
}

function initialParameters(features, seed) {
  const random = rng(seed);
  const params = new Float64Array(features + 1);
  for (let j = 0; j < features; j += 1) params[j] = 0.01 * gaussian(random);
  return params;
}

module.exports = {
  layoutHash,
  numel,
  totalLength,
  chunksOf,
  int8ChunksOf,
  encodeBlocks,
  roundHalfEven,
  BLOCK,
  MAX_INT8_CHUNK_ELEMENTS,
  decodeChunk,
  encodeFloat32,
  bf16ToFloat,
  fp16ToFloat,
  rng,
  makeData,
  trueParameters,
  lossAndGradient,
  initialParameters,
  MAX_CHUNK_ELEMENTS,
};
