// Compiles every kernel listed in generated/manifest.json with Tint, through Dawn's null
// backend (no GPU needed), then creates its compute pipeline against an explicit layout
// built from the manifest, under WebGPU's default limits. Exit status 1 on any error.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { create, globals } from 'webgpu';

Object.assign(globalThis, globals);
const dir = process.argv[2] ?? 'generated';
const manifest = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8'));
const adapter = await create(['backend=null']).requestAdapter();
const device = await adapter.requestDevice(); // default limits: what browsers guarantee
const bufferType = { read: 'read-only-storage', read_write: 'storage', uniform: 'uniform' };

let passed = 0, failed = 0;
for (const k of manifest.kernels) {
  const code = readFileSync(join(dir, k.wgsl_file), 'utf8');
  device.pushErrorScope('validation');
  const module = device.createShaderModule({ label: k.name, code });
  const errors = (await module.getCompilationInfo()).messages
    .filter((m) => m.type === 'error')
    .map((m) => `${m.lineNum}:${m.linePos} ${m.message}`);
  const layout = device.createBindGroupLayout({
    entries: k.bindings.map((b) => ({
      binding: b.binding,
      visibility: GPUShaderStage.COMPUTE,
      buffer: { type: bufferType[b.access] },
    })),
  });
  device.createComputePipeline({
    layout: device.createPipelineLayout({ bindGroupLayouts: [layout] }),
    compute: { module, entryPoint: k.entry_point },
  });
  const scopeError = await device.popErrorScope();
  if (scopeError && errors.length === 0) errors.push(scopeError.message);
  if (errors.length === 0) {
    passed++;
    console.log(`tint: ${k.wgsl_file} ok`);
  } else {
    failed++;
    console.log(`tint: ${k.wgsl_file} FAILED\n  ${errors.join('\n  ')}`);
  }
}
console.log(`tint: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
