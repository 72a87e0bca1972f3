/**
 * @kvconnect/checksum: SPEC v1 KV checksums. Cache views over strided memory, planning (layer
 * numbers, head offsets, replica keys, fingerprints), block values on the `ts`, `native` and
 * `cuda` backends (and `cuda-emulated`, the device path's host side without a GPU), the payload codec, and the verifier.
 * @packageDocumentation
 */
export * from './types.js';
export * from './views.js';
export { ReplicaCountError, replicaCount, globalHeads } from './replicas.js';
export {
  HEADS_PER_LAYER,
  parseLayerName,
  fingerprintOf,
  fingerprintOfText,
  planGroup,
  packTables,
  packEntryGroups,
  makeEntry,
  entryExtent,
  type Entry,
  type GroupPlan,
  type GroupSpec,
  type PlannedCache,
  type RankContext,
  type Role,
  type SkipReason,
} from './plan.js';
export * from './backend.js';
export { tsBackend } from './backend-ts.js';
export { loadNativeBackend, nativeCpuIsa, nativeUnavailableReason, type NativeBackendOptions } from './backend-native.js';
export {
  loadCudaBackend,
  cudaUnavailableReason,
  cudaBindings,
  CudaChecksumBackend,
  cudaDeviceProvider,
  cudaSyncCallCount,
  type CudaBackendOptions,
  type CudaTicket,
} from './backend-cuda.js';
export { EmulatedDevice, type EmulatedDeviceOptions } from './backend-emulated.js';
export { BlockChecksummer, StepRows, selectBackend, type BlockRun, type BlockChecksummerBackend, type BlockChecksummerOptions, type CompletedStep } from './compute.js';
export * from './payload.js';
export * from './verify.js';
export { runVectors, type CaseResult } from './conformance.js';
export { BlockSampler, SAMPLE_SPAN_TOKENS, SAMPLE_THRESHOLD_ALL, sampleThreshold, sampleRateOf } from './sampling.js';
export { subBlockView, subBlockGroupSpecs, sumSubBlocks } from './sub-blocks.js';
export {
  fineSums,
  mergeFineSums,
  compareFineSums,
  summarizeDifferences,
  regionText,
  describeRegions,
  encodeFineSums,
  decodeFineSums,
  finePartCode,
  finePartOfCode,
  LocalizeError,
  MAX_FINE_SUMS,
  fineSumsWindowed,
  type RegionReader,
  type FineSum,
  type FinePart,
  type FineRun,
  type FineDifference,
  type LocalizedRegion,
} from './localize.js';
