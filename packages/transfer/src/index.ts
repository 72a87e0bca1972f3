/**
 * `@kvconnect/transfer`: the {@link TransferAgent} interface (NIXL-shaped) and its
 * implementations: the embedded agent (TCP, plain Node), the NIXL agent (`libnixl_capi.so`) and
 * the Mooncake agent (the Transfer Engine's `libtransfer_engine.so`), both loaded at run time by
 * the native addon; the cluster secret and the side-channel authentication (`auth.ts`).
 * @module
 */
export * from './types.js';
export { TransferError, ProtocolError, isTransferError } from './errors.js';
export * from './auth.js';
export * from './http.js';
export { takeBytes } from './wire.js';
export { EmbeddedAgent, decodeMetadata as decodeEmbeddedMetadata, type EmbeddedAgentOptions, type PeerInfo as EmbeddedPeerInfo } from './embedded.js';
export { MAX_LANES } from './embedded-conn.js';
export { SharedHostArena, sameHostKey, lookupShared } from './shared-memory.js';
export { NixlAgent, loadNixlLibrary, nixlBackendParams, nixlLibraryCandidates, NIXL_STATUS, type NixlAgentOptions } from './nixl.js';
export {
  MooncakeAgent,
  loadMooncakeLibrary,
  mooncakeLibraryCandidates,
  encodeMooncakeMetadata,
  decodeMooncakeMetadata,
  MOONCAKE_STATUS,
  type MooncakeAgentOptions,
  type MooncakeMetadata,
} from './mooncake.js';
export { TRANSFER_ENGINES, TRANSFER_ENGINE_LIBRARIES, isTransferEngine, transferEngineUnavailable, type TransferEngine } from './engines.js';
export {
  cudaDeviceMemory,
  emulatedDeviceMemory,
  deviceMemoryFor,
  readDeviceBytes,
  deviceMemoryOf,
  DeviceMemoryError,
  EmulatedDeviceMemory,
  IPC_HANDLE_BYTES,
  NO_CUDA_MESSAGE,
  type CopyKind,
  type DeviceCopy,
  type DeviceMemory,
  type DeviceMemoryErrorCode,
  type KVDeviceMode,
} from './device.js';
export { strictDecoders, describeValue, type DecodeFail, type StrictDecoders } from './strict-decode.js';
