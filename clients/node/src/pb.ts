// The generated messages and services (protoc-gen-es), for calls the idiomatic layer lacks.

export * from "./gen/baton/v1/autocomplete_pb.js";
export * from "./gen/baton/v1/lease_pb.js";
export * from "./gen/baton/v1/lock_pb.js";
export * from "./gen/baton/v1/ratelimit_pb.js";
export * from "./gen/baton/v1/semaphore_pb.js";
