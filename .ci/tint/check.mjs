// Compiles every kernel listed in generated/manifest.json with Tint, through Dawn's null
// backend (no GPU needed), then creates its compute pipeline against an explicit layout
// built from the manifest: `webgpu`-target kernels under WebGPU's default limits (what
// every browser guarantees), `native` ones under the limits their description states.
// Exit status 1 on any error.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { create, globals } from 'webgpu';

Object.assign(globalThis, globals);
const dir = process.argv[2] ?? 'generated';
const manifest = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8'));
const gpu = create(['backend=null']);
const portable = await (await gpu.requestAdapter()).requestDevice();
const adapter = await gpu.requestAdapter(); // one device per adapter
// Dawn's null adapter offers WebGPU's defaults and little more, so a native kernel whose
// stated limits exceed it is compiled by Tint (the WGSL check) without a pipeline.
const roomy = await adapter.requestDevice({
  requiredLimits: {
    maxStorageBuffersPerShaderStage: adapter.limits.maxStorageBuffersPerShaderStage,
    maxComputeWorkgroupStorageSize: adapter.limits.maxComputeWorkgroupStorageSize,
    maxComputeInvocationsPerWorkgroup: adapter.limits.maxComputeInvocationsPerWorkgroup,
  },
});
// `dtype: f16` kernels need WebGPU's optional shader-f16 feature (WebGPU's defaults
// otherwise); Dawn's null adapter has it.
const halfAdapter = await gpu.requestAdapter();
const half = halfAdapter.features.has('shader-f16')
  ? await halfAdapter.requestDevice({ requiredFeatures: ['shader-f16'] })
  : null;
function deviceFor(target, usesF16) {
  if (usesF16) {
    if (!half) throw new Error('the adapter lacks shader-f16 for an f16 kernel');
    return { device: half, pipeline: target === 'webgpu' };
  }
  if (target === 'webgpu') return { device: portable, pipeline: true };
  const l = target.native;
  const fits = l.storage_buffers_per_stage <= roomy.limits.maxStorageBuffersPerShaderStage
    && l.workgroup_storage_bytes <= roomy.limits.maxComputeWorkgroupStorageSize
    && l.invocations_per_workgroup <= roomy.limits.maxComputeInvocationsPerWorkgroup;
  return { device: roomy, pipeline: fits };
}
const bufferType = { read: 'read-only-storage', read_write: 'storage', uniform: 'uniform' };

let passed = 0, failed = 0;
for (const k of manifest.kernels) {
  const code = readFileSync(join(dir, k.wgsl_file), 'utf8');
  const { device, pipeline } = deviceFor(k.target, k.bindings.some((b) => b.scalar === 'f16'));
  device.pushErrorScope('validation');
  const module = device.createShaderModule({ label: k.name, code });
  const errors = (await module.getCompilationInfo()).messages
    .filter((m) => m.type === 'error')
    .map((m) => `${m.lineNum}:${m.linePos} ${m.message}`);
  if (pipeline) {
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
  }
  const scopeError = await device.popErrorScope();
  if (scopeError && errors.length === 0) errors.push(scopeError.message);
  if (errors.length === 0) {
    passed++;
    const note = pipeline ? '' : ' (WGSL only: its native limits exceed the null adapter, no pipeline)';
    console.log(`tint: ${k.wgsl_file} ok${note}`);
  } else {
    failed++;
    console.log(`tint: ${k.wgsl_file} FAILED\n  ${errors.join('\n  ')}`);
  }
}
console.log(`tint: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
