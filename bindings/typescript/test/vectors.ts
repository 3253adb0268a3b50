/**
 * Loads the language-neutral vectors of spec/vectors/: $PYMQ_SPEC_VECTORS, else the first spec/vectors
 * found walking up from this file (the binding lives inside the pymq repository).
 *
 * Every file loaded is appended, one name per line, to $PYMQ_VECTORS_REPORT when it is set:
 * tests/bindings/test_vector_coverage.py compares that list with spec/vectors/bindings.json, so a vector
 * file that this binding neither runs nor declares not applicable fails CI.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';

export function vectorsDir(): string {
  if (process.env.PYMQ_SPEC_VECTORS) return process.env.PYMQ_SPEC_VECTORS;
  let dir = __dirname;
  for (;;) {
    const candidate = path.join(dir, 'spec', 'vectors');
    if (fs.existsSync(candidate)) return candidate;
    const parent = path.dirname(dir);
    if (parent === dir) throw new Error('spec/vectors not found above the test directory; set PYMQ_SPEC_VECTORS');
    dir = parent;
  }
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export function loadVectors(name: string): any {
  const parsed = JSON.parse(fs.readFileSync(path.join(vectorsDir(), name), 'utf-8'));
  if (process.env.PYMQ_VECTORS_REPORT) fs.appendFileSync(process.env.PYMQ_VECTORS_REPORT, `${name}\n`);
  return parsed;
}

export function fromHex(hex: string): Uint8Array {
  return new Uint8Array(Buffer.from(hex, 'hex'));
}

export function toHex(data: Uint8Array): string {
  return Buffer.from(data).toString('hex');
}
