//! Compiles `proto/` into Rust with tonic-prost-build, using the vendored `protoc` so that a fresh
//! machine needs no system protoc. The descriptor set is written beside the generated code for
//! gRPC server reflection.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { env::set_var("PROTOC", protoc) };

    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let protos = [
        "proto/baton/v1/autocomplete.proto",
        "proto/baton/v1/election.proto",
        "proto/baton/v1/lease.proto",
        "proto/baton/v1/lock.proto",
        "proto/baton/v1/ratelimit.proto",
        "proto/baton/v1/semaphore.proto",
    ];
    tonic_prost_build::configure()
        // Small per-call buffers: a sidecar holds thousands of keepalive streams (src/codec.rs).
        .codec_path("crate::codec::LeanCodec")
        .file_descriptor_set_path(out_dir.join("baton_descriptor.bin"))
        .compile_protos(&protos, &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
