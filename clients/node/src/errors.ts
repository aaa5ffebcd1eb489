// The errors Baton's calls throw: a gRPC status mapped to a few clear classes, with Baton's error
// details decoded (the field a BadRequest names, the delay a RetryInfo suggests, ErrorInfo).

import { Code, ConnectError } from "@connectrpc/connect";
import { durationMs } from "@bufbuild/protobuf/wkt";
import { BadRequestSchema, ErrorInfoSchema, RetryInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/** A call to Baton failed; `code` is the gRPC status code (undefined when no call failed). */
export class BatonError extends Error {
  /** `google.rpc.ErrorInfo` reason, when Baton sent one. */
  reason?: string;
  /** `google.rpc.ErrorInfo` metadata, when Baton sent one. */
  metadata: Record<string, string> = {};
  constructor(
    message: string,
    readonly code?: Code,
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** A request field is missing, empty, too large or out of range; `field` names it. */
export class InvalidArgumentError extends BatonError {
  constructor(message: string, readonly field: string, options?: ErrorOptions) {
    super(message, Code.InvalidArgument, options);
  }
}

/**
 * Baton cannot be reached (its TLS certificate refused by this client included: the message
 * says why), or Redis did not answer in time; nothing was acquired.
 */
export class UnavailableError extends BatonError {
  constructor(message: string, readonly retryAfterMs?: number, options?: ErrorOptions) {
    super(message, Code.Unavailable, options);
  }
}

/**
 * Baton refused the call's credentials: no API token or a wrong one (`apiToken`, `apiTokenFile`
 * or BATON_API_TOKEN_FILE), or with mutual TLS no valid client certificate (`tlsCert`,
 * `tlsKey`). The message says which.
 */
export class UnauthenticatedError extends BatonError {}

/** The call cannot apply now: a token that no longer holds, a refused upgrade, a reused key. */
export class FailedPreconditionError extends BatonError {}

/** The call's deadline passed before Baton answered. */
export class DeadlineExceededError extends BatonError {}

/** A lease already has the most holds allowed. */
export class ResourceExhaustedError extends BatonError {}

/** The lock or the permits stayed taken for the whole wait. */
export class NotAcquiredError extends BatonError {
  constructor(
    message: string,
    /** Remaining ttl of what kept the caller out, in ms, when known. */
    readonly holderRemainingMs?: number,
    /** Permits that were free (semaphores). */
    readonly available?: number,
  ) {
    super(message);
  }
}

/**
 * The lease ended while it was held, or can no longer be vouched for: stop acting as holder.
 *
 * `reason` is Baton's LeaseLostReason without its prefix (`NOT_HELD`, `UNCONFIRMED`, `SHUTDOWN`,
 * `CLIENT_UNRESPONSIVE`), or the client's own `EXPIRED` (the lease's `expiresAt` passed on the
 * local clock with no newer renewal: Baton may be frozen or cut off), `DISCONNECTED` (the
 * stream broke before Baton said anything) or `RELEASED` (the lease was released by its holder:
 * what `check()` throws, and the lease's `signal` is aborted with, once `release()` was called).
 */
export class LeaseLostError extends BatonError {
  constructor(message: string, override readonly reason: string, options?: ErrorOptions) {
    super(message, undefined, options);
  }
}

/**
 * The client was closed (`close()`) before or during the call: connect a new one. Leases still
 * held through it end with the connection (Baton releases them).
 */
export class ClientClosedError extends BatonError {
  constructor(message = "the client is closed") {
    super(message);
  }
}

/**
 * Node's codes for a server certificate its TLS did not accept: OpenSSL's verify results
 * (`UNABLE_TO_VERIFY_LEAF_SIGNATURE`, `CERT_HAS_EXPIRED`, `SELF_SIGNED_CERT_IN_CHAIN`...) and the
 * host name check.
 */
const REFUSED_CERTIFICATE =
  /^(HOSTNAME_MISMATCH|INVALID_CA|INVALID_PURPOSE|PATH_LENGTH_EXCEEDED|UNABLE_TO_\w+|(\w+_)?(CERT|CRL)(_\w+)?)$/;

/** The code of the certificate refusal behind `error` (its causes included), if that is what it is. */
function refusedCertificate(error: unknown): string | undefined {
  let e = error;
  for (let depth = 0; e instanceof Error && depth < 5; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && REFUSED_CERTIFICATE.test(code)) return code;
    e = e.cause;
  }
  return undefined;
}

/** The BatonError for whatever a call threw (ConnectErrors are mapped, others wrapped). */
export function fromError(error: unknown): BatonError {
  if (error instanceof BatonError) return error;
  const e = ConnectError.from(error);
  const message = `${Code[e.code]}: ${e.rawMessage}`;
  // Connect reports a TLS handshake this client refused as Internal; for gRPC (and Baton's
  // Python client) Baton is unavailable then: the call never reached it.
  const refused = e.code === Code.Internal || e.code === Code.Unknown ? refusedCertificate(e.cause) : undefined;
  if (refused !== undefined) {
    return new UnavailableError(`Unavailable: this client refused Baton's TLS certificate (${refused}): ${e.rawMessage}`, undefined, {
      cause: e,
    });
  }
  let mapped: BatonError;
  switch (e.code) {
    case Code.InvalidArgument: {
      const bad = e.findDetails(BadRequestSchema)[0];
      mapped = new InvalidArgumentError(message, bad?.fieldViolations[0]?.field ?? "", { cause: e });
      break;
    }
    case Code.Unavailable: {
      const retry = e.findDetails(RetryInfoSchema)[0];
      const delay = retry?.retryDelay ? durationMs(retry.retryDelay) : undefined;
      mapped = new UnavailableError(message, delay, { cause: e });
      break;
    }
    case Code.Unauthenticated:
      mapped = new UnauthenticatedError(message, e.code, { cause: e });
      break;
    case Code.FailedPrecondition:
      mapped = new FailedPreconditionError(message, e.code, { cause: e });
      break;
    case Code.DeadlineExceeded:
      mapped = new DeadlineExceededError(message, e.code, { cause: e });
      break;
    case Code.ResourceExhausted:
      mapped = new ResourceExhaustedError(message, e.code, { cause: e });
      break;
    default:
      mapped = new BatonError(message, e.code, { cause: e });
  }
  const info = e.findDetails(ErrorInfoSchema)[0];
  if (info) {
    mapped.reason = info.reason;
    mapped.metadata = { ...info.metadata };
  }
  return mapped;
}
