/**
 * @kvconnect/engine: the reference host engine of kvconnect. Requests with sampling, a scheduler
 * with continuous batching, chunked prefill and preemption, a paged KV cache manager with several
 * groups and prefix caching, TP x PP workers holding real KV in configurable layouts and dtypes, a
 * small transformer (GQA, sliding window, MLA, Mamba2) computed in float32, a byte tokenizer, and
 * the P/D proxy. KV connectors and KV checksums plug in through @kvconnect/core.
 * @packageDocumentation
 */
export * from './dtype.js';
export * from './tokenizer.js';
export { SeededRng } from './rng.js';
export * from './model/config.js';
export { buildWeights, type ModelWeights, type LayerWeights, type Matrix } from './model/weights.js';
export { BlockPool, KVCacheManager, blockHash, blockHashes, type PrefixHit, type CacheRequest } from './kv-cache-manager.js';
export { Request, argmax, type SamplingParams, type RequestStatus } from './request.js';
export { Scheduler, type SchedulerOptions, type ScheduledSegment, type StepPlan, type SchedulerStats } from './scheduler.js';
export { Worker, partAddress, stateAddress, type CacheLayout, type ForwardSegment, type WorkerOptions } from './worker.js';
export { forward } from './executor.js';
export { forwardPath, setForwardPath } from './model/native-forward.js';
export { Engine, buildGroupConfigs, type EngineOptions, type GenerateResult, type StepResult } from './engine.js';
export { PDProxy, type PDCallOptions, type PDEndpoint, type PDProxyOptions, type PDResult } from './proxy.js';
export { checkChecksumBackend, checksumWorkerSetup, ChecksumBackendMemoryError, type EngineChecksumBackend } from './checksum-device.js';
export { startEngineServer, type EngineServer, type EngineServerOptions, type ServerLogger } from './server/engine-server.js';
export { EngineClient, EngineClientError, type EngineCallOptions, type EngineClientOptions, type RemoteGenerateResult, type RemoteSamplingParams, type StreamDelta } from './server/engine-client.js';
export { startProxyServer, type ProxyServer, type ProxyServerOptions } from './server/proxy-server.js';
export {
  parseCompletionRequest,
  applyChatTemplate,
  findStop,
  ResponseFormat,
  type ChatMessage,
  type CompletionKind,
  type CompletionRequest,
  type ResponseExtras,
  type Usage,
  type CompletionResponse,
  type CompletionLimits,
  type KVConnectInfo,
  type LoadInfo,
  type PayloadInfo,
} from './server/protocol.js';
export {
  launchEngineProcess,
  launchProxyProcess,
  LaunchError,
  ENGINE_BIN,
  PROXY_BIN,
  type LaunchOptions,
  type LaunchEngineOptions,
  type LaunchProxyOptions,
  type LaunchedProcess,
  type LaunchedEngine,
  type LaunchedProxy,
} from './server/launcher.js';
export { parseEngineArgs, parseProxyArgs, engineOptionsOf, runEngineMain, runProxyMain, type EngineProcessConfig, type ProxyProcessConfig } from './server/main.js';
