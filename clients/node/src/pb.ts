// The generated messages and services (protoc-gen-es), for calls the idiomatic layer lacks, and
// the google.rpc error details Baton sends (BadRequest, RetryInfo, ErrorInfo in a Status).

export * from "./gen/baton/v1/autocomplete_pb.js";
export * from "./gen/baton/v1/election_pb.js";
export * from "./gen/baton/v1/lease_pb.js";
export * from "./gen/baton/v1/lock_pb.js";
export * from "./gen/baton/v1/ratelimit_pb.js";
export * from "./gen/baton/v1/semaphore_pb.js";
export * from "./gen/google/rpc/error_details_pb.js";
export * from "./gen/google/rpc/status_pb.js";
