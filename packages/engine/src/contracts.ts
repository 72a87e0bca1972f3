/**
 * The contract types this package uses from @kvconnect/core, in one place.
 * @module
 */
export type {
  BlockIdsPerGroup,
  ConnectorRequest,
  FinishReason,
  HandshakeMetadataByWorker,
  KVCacheGroupConfig,
  KVChecksumSchedulerHooks,
  KVChecksumWorkerHooks,
  KVConnectorFactory,
  KVConnectorMetadata,
  KVConnectorOutput,
  KVConnectorScheduler,
  KVConnectorWorker,
  KVTransferConfig,
  KVTransferParams,
  LoadDecision,
  LoadError,
  MatchedTokens,
  RequestFinishedResult,
  SchedulerOutput,
  TransferResults,
  WorkerKVCaches,
} from '@kvconnect/core';
