// Baton's Node client: distributed locks, semaphores, leader election, rate limits and
// autocomplete over gRPC.
//
// Messages and services generated from proto/ by protoc-gen-es are re-exported under `pb`
// (fencing tokens are bigints).

export {
  Autocomplete,
  Baton,
  DEFAULT_ADDR,
  RateLimits,
  resolveAddress,
  TOKEN_FILE_ENV,
  type Address,
  type CampaignOptions,
  type ConnectOptions,
  type ElectionState,
  type Feature,
  type Leader,
  type LockGrant,
  type LockOptions,
  type LockState,
  type MatchMode,
  type PermitGrant,
  type RateLimitDecision,
  type RecentItem,
  type SemaphoreOptions,
  type SemaphoreState,
  type Suggestion,
  type Completions,
  type Term,
} from "./client.js";
export {
  BatonError,
  ClientClosedError,
  DeadlineExceededError,
  FailedPreconditionError,
  InvalidArgumentError,
  LeaseLostError,
  NotAcquiredError,
  ResourceExhaustedError,
  UnauthenticatedError,
  UnavailableError,
} from "./errors.js";
export { Leadership, Lease } from "./lease.js";
export * as pb from "./pb.js";
