/**
 * Test utility: the engine's `InProcessConnector`, which lives in `@kvconnect/engine/testing`
 * (src/testing/in-process-connector.ts); re-exported here for the tests that import this path.
 */
export * from '@kvconnect/engine/testing';
